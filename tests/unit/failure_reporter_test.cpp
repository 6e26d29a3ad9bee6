#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "failure_reporter.hpp"

using namespace muster::launcher;
using namespace std::chrono_literals;

namespace {

std::string scratch_path(const char* name) {
  return "/tmp/muster_reporter_" + std::to_string(getpid()) + "_" + name;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ObservedFailure failed(int local_rank, int code, bool stopped = false) {
  return ObservedFailure{local_rank, ExitStatus{false, code}, stopped};
}

WorkerExit exit_of(int local_rank, pid_t pid, int code) {
  return WorkerExit{local_rank, pid, ExitStatus{false, code}, std::chrono::system_clock::now()};
}

}  // namespace

TEST_CASE("the reporter names this node's root cause and hands its error file to the parent", "[reporter]") {
  std::string worker_file = scratch_path("worker.json");
  std::string parent_file = scratch_path("parent.json");
  {
    std::ofstream(worker_file) << R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback: boom"}}, "timestamp": "1"})";
  }
  std::string said;
  FailureReporter reporter({"train.py", "node-a", parent_file, 0ms, false}, [&](const std::string& s) { said += s; });
  reporter.start_attempt(4);
  reporter.set_error_file(0, worker_file);
  reporter.set_error_file(1, "");
  reporter.exited(exit_of(0, 100, 3));
  reporter.report_local({failed(0, 3), failed(1, -15, true)}, [](int) { return pid_t{200}; });

  CHECK(said.rfind("ChildFailedError: ", 0) == 0);
  CHECK(said.find("train.py FAILED") != std::string::npos);
  CHECK(said.find("rank      : 4 (local_rank: 0)") != std::string::npos);
  CHECK(said.find("exitcode  : 3 (pid: 100)") != std::string::npos);
  CHECK(said.find("pid: 200") != std::string::npos);  // the running worker's pid comes from pid_of
  // The parent gets the root cause's file with its exit code.
  std::string copied = read_all(parent_file);
  CHECK(copied.find("\"errorCode\":3") != std::string::npos);
  CHECK(copied.find("Traceback: boom") != std::string::npos);
  std::remove(worker_file.c_str());
  std::remove(parent_file.c_str());
}

TEST_CASE("a failure elsewhere is the job's root cause and this node's workers its victims", "[reporter]") {
  std::string said;
  FailureReporter reporter({"train.py", "node-b", std::nullopt, 0ms, false}, [&](const std::string& s) { said += s; });
  reporter.start_attempt(2);
  reporter.exited(exit_of(0, 300, -15));
  muster::rendezvous::FailureInfo root;
  root.global_rank = 1;
  root.local_rank = 1;
  root.exitcode = 7;
  root.pid = 42;
  root.host = "node-a";
  root.message = "it broke";
  root.timestamp = 1;
  reporter.report_job(root, {failed(0, -15, true)}, "node-b", 1, true, [](int) { return pid_t{0}; });
  CHECK(said.find("<N/A> (on node-a)") != std::string::npos);
  CHECK(said.find("it broke") != std::string::npos);
  CHECK(said.find("stopped by muster after rank 1 on node-a failed") != std::string::npos);

  SECTION("with one report per job, only node rank 0 prints it") {
    std::string quiet;
    FailureReporter step({"train.py", "node-b", std::nullopt, 0ms, true}, [&](const std::string& s) { quiet += s; });
    step.start_attempt(2);
    step.report_job(root, {failed(0, -15, true)}, "node-b", 1, true, [](int) { return pid_t{0}; });
    CHECK(quiet.find("ChildFailedError") == std::string::npos);
    CHECK(quiet.find("node rank 0's agent prints the job's failure report") != std::string::npos);
  }
}

TEST_CASE("a worker killed as hung tells the rendezvous why, with SIGKILL's code until its exit is seen",
          "[reporter]") {
  FailureReporter reporter({"train.py", "node-a", std::nullopt, 5000ms, false}, [](const std::string&) {});
  reporter.start_attempt(8);
  reporter.hung(1, 6200ms);
  auto f = reporter.rendezvous_failure(1, "10.0.0.1");
  CHECK(f.global_rank == 9);
  CHECK(f.host == "10.0.0.1");
  CHECK(f.exitcode == -SIGKILL);
  CHECK(f.message.rfind("hung: no progress for 6.2", 0) == 0);
  CHECK(f.message.find("--worker-timeout 5") != std::string::npos);
  // A new attempt forgets it.
  reporter.start_attempt(8);
  CHECK_FALSE(reporter.is_hung(1));
  CHECK(reporter.rendezvous_failure(1, "10.0.0.1").exitcode == 1);
}
