#include <catch2/catch.hpp>

#include <csignal>

#include "agent_core.hpp"

using namespace muster::launcher;

namespace {

ExitStatus ok() { return {false, 0}; }
ExitStatus code(int c) { return {false, c}; }
ExitStatus sig(int s) { return {true, s}; }

template <typename T>
bool has(const std::vector<Action>& actions) {
  for (const auto& a : actions) {
    if (std::holds_alternative<T>(a)) return true;
  }
  return false;
}

int finish_code(const std::vector<Action>& actions) {
  for (const auto& a : actions) {
    if (auto* f = std::get_if<action::Finish>(&a)) return f->exit_code;
  }
  return -1;
}

}  // namespace

TEST_CASE("all workers succeeding ends the run with 0", "[core]") {
  AgentCore core(2, 0);
  auto start = core.start();
  REQUIRE(start.size() == 1);
  CHECK(std::get<action::StartWorkers>(start[0]).restart_count == 0);
  CHECK(core.on_worker_exit(1, ok()).empty());
  CHECK(finish_code(core.on_worker_exit(0, ok())) == 0);
  CHECK(core.phase() == Phase::finished);
}

TEST_CASE("one failure stops the others and then restarts while restarts remain", "[core]") {
  AgentCore core(3, 1);
  core.start();
  auto fail = core.on_worker_exit(1, code(3));
  REQUIRE(has<action::SignalWorkers>(fail));
  CHECK(std::get<action::SignalWorkers>(fail[0]).signo == SIGTERM);
  CHECK(has<action::ArmShutdownTimer>(fail));
  CHECK(core.on_worker_exit(0, sig(SIGTERM)).empty());
  auto restart = core.on_worker_exit(2, sig(SIGTERM));
  CHECK(has<action::CancelShutdownTimer>(restart));
  REQUIRE(has<action::StartWorkers>(restart));
  CHECK(core.restart_count() == 1);
  CHECK(core.failures().empty());
  // The second attempt fails too: no restarts left.
  core.on_worker_exit(0, code(1));
  core.on_worker_exit(1, ok());
  auto end = core.on_worker_exit(2, sig(SIGTERM));
  CHECK(finish_code(end) == 1);
  REQUIRE(core.failures().size() == 2);
  CHECK(core.failures()[0].local_rank == 0);
  CHECK_FALSE(core.failures()[0].stopped_by_agent);
  CHECK(core.failures()[1].local_rank == 2);
  CHECK(core.failures()[1].stopped_by_agent);
}

TEST_CASE("a single worker failing with no restarts finishes at once", "[core]") {
  AgentCore core(1, 0);
  core.start();
  auto a = core.on_worker_exit(0, sig(SIGSEGV));
  CHECK_FALSE(has<action::SignalWorkers>(a));
  CHECK(finish_code(a) == 1);
  CHECK(core.stop_reason() == StopReason::failure);
}

TEST_CASE("the grace timer kills what is left", "[core]") {
  AgentCore core(2, 0);
  core.start();
  core.on_worker_exit(0, code(1));
  auto kill = core.on_shutdown_timer();
  CHECK(has<action::KillWorkers>(kill));
  REQUIRE(has<action::ArmShutdownTimer>(kill));
  CHECK(finish_code(core.on_worker_exit(1, sig(SIGKILL))) == 1);
  CHECK(core.on_shutdown_timer().empty());
}

TEST_CASE("a worker that survives SIGKILL is abandoned after a bounded wait", "[core]") {
  AgentCore core(2, 3);
  core.start();
  core.on_worker_exit(0, code(1));
  core.on_shutdown_timer();
  auto give_up = core.on_shutdown_timer();
  CHECK(has<action::AbandonWorkers>(give_up));
  CHECK(finish_code(give_up) == 1);
  CHECK_FALSE(has<action::StartWorkers>(give_up));
  CHECK(core.phase() == Phase::finished);
}

TEST_CASE("a signal is forwarded as is and ends the run with 1, never restarting", "[core]") {
  AgentCore core(2, 5);
  core.start();
  auto s = core.on_signal(SIGINT);
  REQUIRE(has<action::SignalWorkers>(s));
  CHECK(std::get<action::SignalWorkers>(s[0]).signo == SIGINT);
  CHECK(has<action::ArmShutdownTimer>(s));
  core.on_worker_exit(0, sig(SIGINT));
  auto end = core.on_worker_exit(1, code(130));
  CHECK(finish_code(end) == 1);
  CHECK_FALSE(has<action::StartWorkers>(end));
  CHECK(core.received_signal() == SIGINT);
}

TEST_CASE("a signal during a failure stop turns it into a shutdown", "[core]") {
  AgentCore core(2, 5);
  core.start();
  core.on_worker_exit(0, code(1));
  auto s = core.on_signal(SIGTERM);
  CHECK(has<action::SignalWorkers>(s));
  auto end = core.on_worker_exit(1, sig(SIGTERM));
  CHECK(finish_code(end) == 1);
  CHECK(core.stop_reason() == StopReason::signal);
}

TEST_CASE("a signal before the workers start ends the run", "[core]") {
  AgentCore core(2, 0);
  CHECK(finish_code(core.on_signal(SIGTERM)) == 1);
  CHECK(core.start().empty());
}

TEST_CASE("exits of unknown or already-exited ranks are ignored", "[core]") {
  AgentCore core(2, 0);
  core.start();
  CHECK(core.on_worker_exit(5, code(1)).empty());
  core.on_worker_exit(0, ok());
  CHECK(core.on_worker_exit(0, code(1)).empty());
  CHECK(core.live_workers() == 1);
}

TEST_CASE("coordinated: workers start on assignment, a failure is reported, the rendezvous decides", "[core]") {
  AgentCore core(2, 5, true);
  CHECK(core.start().empty());
  auto start = core.on_assignment(3);
  REQUIRE(has<action::StartWorkers>(start));
  CHECK(std::get<action::StartWorkers>(start[0]).restart_count == 3);
  auto fail = core.on_worker_exit(0, code(1));
  CHECK(has<action::ReportFailure>(fail));
  CHECK(has<action::SignalWorkers>(fail));
  auto stopped = core.on_worker_exit(1, sig(SIGTERM));
  CHECK(has<action::WorkersStopped>(stopped));
  CHECK_FALSE(has<action::StartWorkers>(stopped));  // no local restart
  CHECK(core.phase() == Phase::waiting);
  CHECK(has<action::StartWorkers>(core.on_assignment(4)));
  CHECK(core.restart_count() == 4);
}

TEST_CASE("coordinated: a stop order stops the workers, then the job may finish", "[core]") {
  AgentCore core(2, 0, true);
  core.on_assignment(0);
  auto order = core.on_stop_order();
  CHECK(has<action::SignalWorkers>(order));
  core.on_worker_exit(0, sig(SIGTERM));
  CHECK(has<action::WorkersStopped>(core.on_worker_exit(1, sig(SIGTERM))));
  CHECK(core.failures().size() == 2);
  CHECK(core.failures()[0].stopped_by_agent);
  CHECK(finish_code(core.on_job_finished(1)) == 1);
}

TEST_CASE("coordinated: local success is reported and waits for the job's end", "[core]") {
  AgentCore core(1, 0, true);
  core.on_assignment(0);
  auto done = core.on_worker_exit(0, ok());
  CHECK(has<action::ReportSuccess>(done));
  CHECK(finish_code(done) == -1);
  CHECK(has<action::WorkersStopped>(core.on_stop_order()));
  CHECK(finish_code(core.on_job_finished(0)) == 0);
}

TEST_CASE("coordinated: a signal still ends the run with 1", "[core]") {
  AgentCore core(1, 0, true);
  core.on_assignment(0);
  core.on_signal(SIGTERM);
  CHECK(finish_code(core.on_worker_exit(0, sig(SIGTERM))) == 1);
}
