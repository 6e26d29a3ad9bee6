// The agent's parts that start and watch workers, each on its own: the
// launch planner, the supervisor, the output pump, the store host, and the
// watchdogs' rules (the hang's words, whose expired timer it is).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "async_writer.hpp"
#include "file_timer.hpp"
#include "launch_planner.hpp"
#include "muster/store/client.hpp"
#include "output_pump.hpp"
#include "read_available.hpp"
#include "stack_dump.hpp"
#include "store_host.hpp"
#include "supervisor.hpp"
#include "worker_timeout.hpp"

using namespace muster;
using namespace muster::launcher;
namespace fs = std::filesystem;

namespace {

constexpr auto kBound = std::chrono::seconds(60);  // only a broken wait runs into it

bool has_entry(const std::vector<std::string>& envp, const std::string& entry) {
  return std::find(envp.begin(), envp.end(), entry) != envp.end();
}

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/muster-unit-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

}  // namespace

TEST_CASE("the launch planner lays out an attempt: folders, argv, environment, where output goes", "[parts]") {
  TempDir tmp;
  boost::asio::io_context io;
  AsyncWriter writer(io, nullptr);
  ConsoleSinks console{writer.add_borrowed(STDOUT_FILENO, "stdout"), writer.add_borrowed(STDERR_FILENO, "stderr")};
  LaunchConfig cfg;
  cfg.nproc_per_node = 2;
  cfg.executable = "/bin/echo";
  cfg.args = {"--rank=${local_rank}", "plain"};
  cfg.log_dir = tmp.path;
  cfg.rdzv_id = "job7";
  cfg.local_ranks_filter = std::set<int>{1};
  cfg.redirects = StdSpec::parse("1").value();  // stdout to the log file
  LaunchPlanner planner(cfg, writer, console);
  Environment env{{"PATH", "/usr/bin:/bin"}};
  REQUIRE(planner.resolve_executable(env).ok());
  auto attempt = planner.prepare_attempt(0, env);
  REQUIRE(attempt.ok());
  CHECK(fs::is_directory(attempt.value()));
  CHECK(fs::path(attempt.value()).filename() == "attempt_0");
  GroupAssignment group;
  group.base_global_rank = 2;
  group.global_world_size = 4;
  group.local_world_size = 2;
  group.master_addr = "127.0.0.1";
  group.master_port = 1234;
  group.run_id = "job7";
  auto launches = planner.launches(env, group, attempt.value(), nullptr);
  REQUIRE(launches.ok());
  REQUIRE(launches->size() == 2);
  const auto& one = launches.value()[1];
  CHECK(one.launch.local_rank == 1);
  CHECK(one.launch.path == "/bin/echo");
  CHECK(one.launch.argv == std::vector<std::string>{"/bin/echo", "--rank=1", "plain"});
  CHECK(has_entry(one.launch.envp, "RANK=3"));
  CHECK(has_entry(one.launch.envp, "LOCAL_RANK=1"));
  CHECK(has_entry(one.launch.envp, "WORLD_SIZE=4"));
  CHECK(has_entry(one.launch.envp, "MASTER_PORT=1234"));
  CHECK(one.error_file == attempt.value() + "/1/error.json");
  CHECK(fs::is_directory(attempt.value() + "/1"));
  // stdout: redirected to the file for both; stderr: shown for rank 1, hidden for rank 0 (the filter).
  CHECK(one.launch.out.mode == StreamPlan::Mode::file);
  CHECK(one.launch.out.path == attempt.value() + "/1/stdout.log");
  CHECK(one.launch.err.mode == StreamPlan::Mode::inherit);
  CHECK(launches.value()[0].launch.err.mode == StreamPlan::Mode::devnull);
  // The next attempt has a folder of its own.
  auto second = planner.prepare_attempt(1, env);
  REQUIRE(second.ok());
  CHECK(fs::path(second.value()).filename() == "attempt_1");
  planner.finish();
}

TEST_CASE("the supervisor reports how each worker ended, and signals the ones still running", "[parts]") {
  boost::asio::io_context io;
  std::vector<WorkerExit> exits;
  bool second_runs = false;
  // Once the first has ended by itself and the second is known to run: stop what still runs.
  Supervisor* supervisor = nullptr;
  auto maybe_stop = [&] {
    if (second_runs && exits.size() == 1) boost::asio::post(io, [&] { supervisor->signal_all(SIGTERM); });
  };
  Supervisor sup(io, [&](const WorkerExit& e) {
    exits.push_back(e);
    if (exits.size() == 2) io.stop();
    maybe_stop();
  });
  supervisor = &sup;
  sup.on_worker_pid([&](int local_rank, pid_t pid) {
    CHECK(pid > 0);
    if (local_rank != 1) return;
    second_runs = true;
    maybe_stop();
  });
  auto launch = [](int local_rank, std::string script) {
    WorkerLaunch w;
    w.local_rank = local_rank;
    w.path = "/bin/sh";
    w.argv = {"/bin/sh", "-c", std::move(script)};
    w.envp = {"PATH=/usr/bin:/bin"};
    w.out.mode = StreamPlan::Mode::devnull;
    w.err.mode = StreamPlan::Mode::devnull;
    return w;
  };
  REQUIRE(sup.start({launch(0, "exit 3"), launch(1, "exec sleep 60")}).ok());
  io.run_for(kBound);
  REQUIRE(exits.size() == 2);
  std::sort(exits.begin(), exits.end(), [](auto& a, auto& b) { return a.local_rank < b.local_rank; });
  CHECK_FALSE(exits[0].status.signaled);
  CHECK(exits[0].status.value == 3);
  CHECK(exits[0].status.torch_exitcode() == 3);
  CHECK(exits[1].status.signaled);
  CHECK(exits[1].status.torch_exitcode() == -SIGTERM);
  CHECK(exits[1].pid > 0);
  CHECK(sup.running().empty());
}

TEST_CASE("a worker's end is timed when its shim saw it, not when the agent's loop got to it", "[parts]") {
  boost::asio::io_context io;
  std::optional<WorkerExit> exit;
  Supervisor sup(io, [&](const WorkerExit& e) {
    exit = e;
    io.stop();
  });
  WorkerLaunch w;
  w.path = "/bin/sh";
  w.argv = {"/bin/sh", "-c", "exit 4"};
  w.envp = {"PATH=/usr/bin:/bin"};
  w.out.mode = StreamPlan::Mode::devnull;
  w.err.mode = StreamPlan::Mode::devnull;
  auto before = std::chrono::system_clock::now();
  REQUIRE(sup.start({w}).ok());
  // The loop does not run until the shim (a child of this process named
  // muster-shim) is a zombie, after its worker: the agent learns of the exit late.
  auto zombie_shim = [] {
    bool found = false;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      if (!std::getline(stat, line)) continue;
      auto close = line.rfind(')');
      if (close == std::string::npos || line.find("(muster-shim)") == std::string::npos) continue;
      std::istringstream rest(line.substr(close + 1));
      char state = 0;
      long ppid = 0;
      rest >> state >> ppid;
      found = found || (state == 'Z' && ppid == getpid());
    }
    return found;
  };
  auto deadline = std::chrono::steady_clock::now() + kBound;
  bool shim_gone = false;
  while (!shim_gone && std::chrono::steady_clock::now() < deadline) {
    shim_gone = zombie_shim();
    if (!shim_gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(shim_gone);
  auto loop_ran = std::chrono::system_clock::now();
  io.run_for(kBound);
  REQUIRE(exit);
  CHECK(exit->status.value == 4);
  CHECK(exit->when >= before);
  CHECK(exit->when < loop_ran);
}

TEST_CASE("the output pump hands the file raw bytes and the console prefixed lines, a partial last one too",
          "[parts]") {
  boost::asio::io_context io;
  int worker[2], file[2], console[2], filtered[2];
  for (int* p : {worker, file, console, filtered}) REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  for (int* p : {file, console, filtered}) REQUIRE(fcntl(p[0], F_SETFL, O_NONBLOCK) == 0);
  AsyncWriter writer(io, nullptr);
  PumpTargets t;
  t.writer = &writer;
  t.file = writer.add_owned(net::UniqueFd(file[1]), "file");
  t.console = writer.add_borrowed(console[1], "console");
  t.prefix = "[r0]:";
  t.filtered = writer.add_borrowed(filtered[1], "filtered");
  t.filters = {"loss"};
  int reads = 0;
  t.on_activity = [&] { ++reads; };
  const std::string bytes = "step 1\nloss 0.5\nno newline at the end";
  REQUIRE(::write(worker[1], bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(worker[1]);
  auto pump = std::make_shared<OutputPump>(io, worker[0], std::move(t));
  bool eof = false;
  pump->start([&] { eof = true; });
  io.run_for(kBound);  // ends once the pump, its only work, is done
  REQUIRE(eof);
  CHECK(reads >= 1);
  pump.reset();  // lets go of the file, which the writer then closes
  CHECK(writer.finish(std::chrono::seconds(10)).dropped.empty());
  CHECK(read_available(file[0]) == bytes);
  CHECK(read_available(console[0]) == "[r0]:step 1\n[r0]:loss 0.5\n[r0]:no newline at the end\n");
  CHECK(read_available(filtered[0]) == "[r0]:loss 0.5\n");
  for (int fd : {file[0], console[0], console[1], filtered[0], filtered[1]}) ::close(fd);
}

TEST_CASE("the store host empties the store for each one-node attempt, and keeps it when rounds manage it",
          "[parts]") {
  for (auto emptying : {StoreHost::Emptying::each_attempt, StoreHost::Emptying::by_rounds}) {
    boost::asio::io_context io;
    auto work = boost::asio::make_work_guard(io);
    StoreHost host(io, emptying);
    REQUIRE(host.serve("127.0.0.1", 0).ok());
    REQUIRE(host.serving());
    const int port = host.port();
    REQUIRE(port > 0);
    std::thread loop([&] { io.run_for(kBound); });
    auto client = store::StoreClient::connect("127.0.0.1", port);
    REQUIRE(client.ok());
    REQUIRE(client->set("from_the_last_attempt", "x").ok());
    std::promise<void> done;
    boost::asio::post(io, [&] {
      host.attempt_starting();
      done.set_value();
    });
    done.get_future().wait();
    // Emptying also closes the last attempt's connections: a new one looks.
    auto fresh = store::StoreClient::connect("127.0.0.1", port);
    REQUIRE(fresh.ok());
    auto kept = fresh->check({"from_the_last_attempt"});
    REQUIRE(kept.ok());
    CHECK(kept.value() == (emptying == StoreHost::Emptying::by_rounds));
    if (emptying == StoreHost::Emptying::each_attempt) CHECK_FALSE(client->check({"from_the_last_attempt"}).ok());
    io.stop();
    loop.join();
  }
}

TEST_CASE("the watchdogs' rules: a hang's words and whose expired timer it is", "[parts]") {
  std::vector<ProgressWatch::Silent> silent(2);
  silent[0].local_rank = 0;
  silent[0].silent_for = std::chrono::milliseconds(12500);
  silent[1].local_rank = 2;
  silent[1].silent_for = std::chrono::seconds(13);
  auto text = hang_text(silent, 8, [](int lr) { return static_cast<pid_t>(1000 + lr); }, std::chrono::seconds(10));
  CHECK_THAT(text, Catch::StartsWith("worker watchdog: rank 8 (local_rank 0, pid 1000) silent for 12.5 s; "
                                     "rank 10 (local_rank 2, pid 1002) silent for 13 s"));
  CHECK_THAT(text, Catch::Contains("within --worker-timeout 10 s; taking it for hung: sending SIGKILL"));
  // A timer is a worker's when it names the worker or a process of the worker's session.
  std::vector<std::pair<int, pid_t>> running{{0, 500}, {1, 600}};
  CHECK(expired_timer_owner(600, 600, running) == 1);
  CHECK(expired_timer_owner(777, 500, running) == 0);  // started by worker 0, in its session
  CHECK(expired_timer_owner(777, 777, running) == -1);
  CHECK(expired_timer_owner(777, -1, running) == -1);  // gone before it could be looked up
  CHECK(expired_timer_owner(0, 0, {{0, 0}}) == -1);    // a worker whose pid is not known yet
}

namespace {

// A stand-in for py-spy: a script that answers as the test wants.
std::string fake_py_spy(const TempDir& dir, const std::string& body) {
  const std::string path = dir.path + "/py-spy";
  {
    std::ofstream f(path);
    f << "#!/bin/sh\n" << body << "\n";
  }
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

}  // namespace

TEST_CASE("the stack dump runs one py-spy per worker at once, and keeps to its limit", "[parts]") {
  TempDir dir;
  boost::asio::io_context io;
  SECTION("each dump's output and how it ended, by worker") {
    // Prints its arguments; fails for pid 2.
    StackDump dump(io, fake_py_spy(dir, "echo \"$@\"; echo to stderr >&2; [ \"$3\" != 2 ]"), std::chrono::seconds(30));
    REQUIRE(dump.available());
    std::vector<StackDump::Stack> got;
    REQUIRE(dump.dump({{0, 4, 1}, {1, 5, 2}}, [&](std::vector<StackDump::Stack> s) { got = std::move(s); }));
    CHECK(dump.running());
    CHECK_FALSE(dump.dump({{0, 4, 1}}, [](std::vector<StackDump::Stack>) {}));  // one at a time
    io.run_for(kBound);
    REQUIRE(got.size() == 2);
    CHECK(got[0].target.global_rank == 4);
    CHECK(got[0].text == "dump --pid 1\nto stderr\n");
    CHECK(got[0].complete);
    CHECK(got[0].how_it_ended == "exit 0");
    CHECK_FALSE(got[1].complete);
    CHECK(got[1].how_it_ended == "exit 1");
    CHECK_FALSE(dump.running());
  }
  SECTION("a dump that hangs is killed at the limit, and the others are kept") {
    StackDump dump(io, fake_py_spy(dir, "[ \"$3\" = 1 ] && exec sleep 60; echo quick"), std::chrono::milliseconds(300));
    std::vector<StackDump::Stack> got;
    const auto started = std::chrono::steady_clock::now();
    REQUIRE(dump.dump({{0, 0, 1}, {1, 1, 2}}, [&](std::vector<StackDump::Stack> s) { got = std::move(s); }));
    io.run_for(kBound);
    REQUIRE(got.size() == 2);
    CHECK(got[0].how_it_ended == "killed at the limit");
    CHECK_FALSE(got[0].complete);
    CHECK(got[1].text == "quick\n");
    CHECK(got[1].complete);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
  }
  SECTION("none: not available, and nothing runs") {
    StackDump dump(io, "", std::chrono::seconds(1));
    CHECK_FALSE(dump.available());
    CHECK_FALSE(dump.dump({{0, 0, 1}}, [](std::vector<StackDump::Stack>) {}));
  }
}
