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
  CHECK_FALSE(core.stopped_by_signal());
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
  CHECK(core.stopped_by_signal());
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
  CHECK(has<action::CancelShutdownTimer>(stopped));
  CHECK_FALSE(has<action::StartWorkers>(stopped));  // no local restart
  CHECK_FALSE(has<action::Rejoin>(stopped));        // the rendezvous decides
  CHECK(finish_code(stopped) == -1);
  CHECK(core.phase() == Phase::waiting);
  CHECK(has<action::StartWorkers>(core.on_assignment(4)));
  CHECK(core.restart_count() == 4);
}

TEST_CASE("coordinated: a finish order stops the workers, then the job finishes with its code", "[core]") {
  AgentCore core(2, 0, true);
  core.on_assignment(0);
  CHECK_FALSE(core.finishing());
  auto order = core.on_finish_order(1);
  CHECK(has<action::SignalWorkers>(order));
  CHECK(core.finishing());  // a connection lost from here on is the job's end, not a fault
  CHECK(finish_code(core.on_worker_exit(0, sig(SIGTERM))) == -1);
  CHECK(finish_code(core.on_worker_exit(1, sig(SIGTERM))) == 1);
  CHECK(core.failures().size() == 2);
  CHECK(core.failures()[0].stopped_by_agent);
  CHECK(core.stop_reason() == StopReason::ordered);
}

TEST_CASE("a worker taken for hung fails the group before its exit is seen", "[core]") {
  AgentCore core(2, 1);
  core.start();
  auto hung = core.on_worker_hung(1);
  CHECK(has<action::SignalWorkers>(hung));
  CHECK(has<action::ArmShutdownTimer>(hung));
  CHECK(core.phase() == Phase::stopping);
  CHECK(core.stop_reason() == StopReason::failure);
  REQUIRE(core.failures().size() == 1);
  CHECK(core.failures()[0].local_rank == 1);
  CHECK(core.failures()[0].status.torch_exitcode() == -SIGKILL);
  CHECK_FALSE(core.failures()[0].stopped_by_agent);
  CHECK(core.on_worker_hung(1).empty());  // once
  CHECK(finish_code(core.on_worker_exit(0, sig(SIGTERM))) == -1);
  CHECK(core.failures().size() == 2);
  CHECK(core.failures()[1].stopped_by_agent);
  auto last = core.on_worker_exit(1, sig(SIGKILL));  // its exit: no second failure, the group restarts
  CHECK(has<action::StartWorkers>(last));
  CHECK(core.restart_count() == 1);
}

TEST_CASE("a hung worker that never exits is given up on after the kill", "[core]") {
  AgentCore core(1, 3);
  core.start();
  core.on_worker_hung(0);
  auto kill = core.on_shutdown_timer();
  CHECK(has<action::KillWorkers>(kill));
  auto end = core.on_shutdown_timer();
  CHECK(has<action::AbandonWorkers>(end));
  CHECK(finish_code(end) == 1);
}

TEST_CASE("coordinated: a hung worker is reported to the rendezvous", "[core]") {
  AgentCore core(2, 0, true);
  core.on_assignment(0);
  CHECK(has<action::ReportFailure>(core.on_worker_hung(0)));
  CHECK(core.on_worker_hung(1).empty());  // silent too, beside the first: its own failure, no new action
  CHECK(core.failures().size() == 2);
  CHECK_FALSE(core.failures()[1].stopped_by_agent);
}

TEST_CASE("coordinated: local success is reported and waits for the job's end", "[core]") {
  AgentCore core(1, 0, true);
  core.on_assignment(0);
  auto done = core.on_worker_exit(0, ok());
  CHECK(has<action::ReportSuccess>(done));
  CHECK(finish_code(done) == -1);
  CHECK_FALSE(core.finishing());  // waiting on the others: a lost connection is still reconnected
  CHECK(finish_code(core.on_finish_order(0)) == 0);
  CHECK(core.finishing());
}

TEST_CASE("coordinated: a signal still ends the run with 1", "[core]") {
  AgentCore core(1, 0, true);
  core.on_assignment(0);
  core.on_signal(SIGTERM);
  CHECK(finish_code(core.on_worker_exit(0, sig(SIGTERM))) == 1);
}

TEST_CASE("coordinated: a restart order stops the workers, then rejoins", "[core][membership]") {
  AgentCore core(2, 0, true);
  core.on_assignment(0);
  CHECK(has<action::SignalWorkers>(core.on_restart_order(false)));
  CHECK_FALSE(has<action::Rejoin>(core.on_worker_exit(0, sig(SIGTERM))));
  auto down = core.on_worker_exit(1, sig(SIGTERM));
  REQUIRE(has<action::Rejoin>(down));
  CHECK_FALSE(std::get<action::Rejoin>(down.back()).fenced);
  CHECK(core.phase() == Phase::waiting);
  CHECK(has<action::StartWorkers>(core.on_assignment(0)));
}

TEST_CASE("coordinated: a failure that came before a restart order's stop is reported, once, before the rejoin",
          "[core][membership]") {
  AgentCore core(3, 0, true);
  core.on_assignment(0);
  REQUIRE(has<action::SignalWorkers>(core.on_restart_order(false)));
  // Ended with its own code before the stop went out: this node's failure too.
  auto own = core.on_worker_exit(0, code(75), true);
  REQUIRE(own.size() == 1);
  CHECK(std::get<action::ReportFailure>(own.front()).local_rank == 0);
  // A second such worker adds no report (one per node and attempt).
  CHECK_FALSE(has<action::ReportFailure>(core.on_worker_exit(1, code(1), true)));
  // The last, stopped by the signal: no report; the node rejoins.
  auto down = core.on_worker_exit(2, sig(SIGTERM), false);
  CHECK_FALSE(has<action::ReportFailure>(down));
  CHECK(has<action::Rejoin>(down));
  // The next attempt may report again.
  core.on_assignment(0);
  core.on_restart_order(false);
  CHECK(has<action::ReportFailure>(core.on_worker_exit(0, code(1), true)));
}

TEST_CASE("a failure seen after the stop signal, or beside a stop of the node's own, is not reported again",
          "[core][membership]") {
  SECTION("after the stop signal") {
    AgentCore core(1, 0, true);
    core.on_assignment(0);
    core.on_restart_order(false);
    CHECK_FALSE(has<action::ReportFailure>(core.on_worker_exit(0, code(1), false)));
  }
  SECTION("this node's failure stopped the group") {
    AgentCore core(2, 1, true);
    core.on_assignment(0);
    CHECK(has<action::ReportFailure>(core.on_worker_exit(0, code(1), true)));
    CHECK_FALSE(has<action::ReportFailure>(core.on_worker_exit(1, code(1), true)));
  }
  SECTION("a signal to the agent") {
    AgentCore core(1, 0, true);
    core.on_assignment(0);
    core.on_signal(SIGTERM);
    CHECK_FALSE(has<action::ReportFailure>(core.on_worker_exit(0, code(1), true)));
  }
  SECTION("a finish order: the job is over, nothing to weigh") {
    AgentCore core(1, 0, true);
    core.on_assignment(0);
    core.on_finish_order(1);
    CHECK_FALSE(has<action::ReportFailure>(core.on_worker_exit(0, code(1), true)));
  }
  SECTION("one node alone reports nothing") {
    AgentCore core(2, 1);
    core.start();
    core.on_worker_exit(0, code(1), true);
    CHECK_FALSE(has<action::ReportFailure>(core.on_worker_exit(1, code(1), true)));
  }
}

TEST_CASE("coordinated: an order that comes while the workers are down is followed at once", "[core][membership]") {
  AgentCore core(1, 0, true);
  core.on_assignment(0);
  core.on_worker_exit(0, code(1));  // reported; waiting for the rendezvous's word
  CHECK(core.phase() == Phase::waiting);
  CHECK(has<action::Rejoin>(core.on_restart_order(false)));
  CHECK(finish_code(core.on_finish_order(1)) == 1);
}

TEST_CASE("coordinated: a fenced node stops its workers and rejoins as a newcomer", "[core][membership]") {
  AgentCore core(2, 0, true);
  core.on_assignment(0);
  auto f = core.on_fenced();
  CHECK(has<action::SignalWorkers>(f));
  CHECK(core.stop_reason() == StopReason::fenced);
  core.on_worker_exit(0, sig(SIGTERM));
  auto down = core.on_worker_exit(1, sig(SIGTERM));
  REQUIRE(has<action::Rejoin>(down));
  CHECK(std::get<action::Rejoin>(down.back()).fenced);
  CHECK(core.failures().size() == 2);
  CHECK(core.failures()[0].stopped_by_agent);  // victims, not a root cause
}

TEST_CASE("coordinated: a finish order is not undone by a later restart order", "[core][membership]") {
  AgentCore core(1, 0, true);
  core.on_assignment(0);
  core.on_finish_order(1);
  CHECK(core.on_restart_order(false).empty());
  CHECK(finish_code(core.on_worker_exit(0, sig(SIGTERM))) == 1);
}

TEST_CASE("coordinated: losing the rendezvous stops the workers and finishes with 1", "[core][membership]") {
  AgentCore core(1, 0, true);
  core.on_assignment(0);
  core.on_rendezvous_lost();
  CHECK(core.stop_reason() == StopReason::lost);
  CHECK(finish_code(core.on_worker_exit(0, sig(SIGTERM))) == 1);
  AgentCore idle(1, 0, true);
  CHECK(finish_code(idle.on_rendezvous_lost()) == 1);  // never assigned: nothing to stop
  AgentCore done(1, 0, true);  // its workers succeeded, the job's end not yet heard
  done.on_assignment(0);
  CHECK(has<action::ReportSuccess>(done.on_worker_exit(0, ok())));
  CHECK(finish_code(done.on_rendezvous_lost()) == 1);
}

TEST_CASE("coordinated: a signal is the root cause and no order changes that", "[core][membership]") {
  AgentCore core(2, 0, true);
  core.on_assignment(0);
  core.on_signal(SIGTERM);
  CHECK(core.on_restart_order(false).empty());
  CHECK(core.on_fenced().empty());
  CHECK(core.on_finish_order(0).empty());
  core.on_worker_exit(0, code(42));  // hit by the same signal: a victim
  CHECK(finish_code(core.on_worker_exit(1, sig(SIGTERM))) == 1);
  CHECK(core.stop_reason() == StopReason::signal);
  for (const auto& f : core.failures()) CHECK(f.stopped_by_agent);
}

TEST_CASE("the lease lapses dead_after past the send time of the latest acknowledged heartbeat", "[core][membership]") {
  using namespace std::chrono_literals;
  Lease lease(15s);
  Lease::Clock::time_point t0{};
  lease.renew(t0);
  CHECK_FALSE(lease.lapsed(t0 + 14s));
  CHECK(lease.lapsed(t0 + 15s));
  lease.sent(1, t0 + 5s);
  lease.sent(2, t0 + 10s);
  CHECK(lease.lapsed(t0 + 15s));  // sent, never acknowledged: no renewal
  lease.acked(1);
  CHECK(lease.expires() == t0 + 20s);  // from the send time, not the ack's arrival
  lease.acked(1);                      // a duplicate changes nothing
  CHECK(lease.expires() == t0 + 20s);
  lease.acked(2);
  CHECK(lease.expires() == t0 + 25s);
  lease.sent(3, t0 + 15s);
  lease.sent(4, t0 + 20s);
  lease.acked(4);  // 3's ack lost: 4's still renews
  CHECK(lease.expires() == t0 + 35s);
  CHECK_FALSE(lease.lapsed(t0 + 34s));
  CHECK(lease.lapsed(t0 + 35s));
}

TEST_CASE("a restart is announced when it is decided, not when the new workers start", "[core]") {
  // One node: at the failure, with torchrun's count (left before this restart / max).
  AgentCore core(2, 2);
  core.start();
  auto fail = core.on_worker_exit(0, code(3));
  REQUIRE(has<action::AnnounceRestart>(fail));
  auto announced = std::get<action::AnnounceRestart>(fail.back());
  CHECK(announced.attempts_left == 2);
  CHECK(announced.max_restarts == 2);
  CHECK_FALSE(has<action::AnnounceRestart>(core.on_worker_exit(1, sig(SIGTERM))));  // the restart itself: no line
  core.on_worker_exit(0, code(3));
  core.on_worker_exit(1, sig(SIGTERM));
  CHECK(core.restart_count() == 2);
  // No restarts left: nothing announced, the job ends.
  CHECK_FALSE(has<action::AnnounceRestart>(core.on_worker_exit(0, code(3))));

  // Many nodes: when the rendezvous's restart order counts the failure.
  AgentCore member(1, 3, true);
  member.on_assignment(1);
  auto counted = member.on_restart_order(true);
  REQUIRE(has<action::AnnounceRestart>(counted));
  CHECK(std::get<action::AnnounceRestart>(counted.back()).attempts_left == 2);
  AgentCore other(1, 3, true);
  other.on_assignment(1);
  CHECK_FALSE(has<action::AnnounceRestart>(other.on_restart_order(false)));  // a membership change
}

namespace {

// The driver performs nothing after Finish: the core puts it last.
bool finish_is_last(const std::vector<Action>& actions) {
  for (std::size_t i = 0; i < actions.size(); ++i) {
    if (std::holds_alternative<action::Finish>(actions[i]) && i + 1 != actions.size()) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a start that fails ends the run with 1, no restart, no report, and takes the start back", "[core]") {
  AgentCore core(2, 3);
  core.start();
  CHECK(core.groups_started() == 1);
  auto end = core.on_start_failed();
  CHECK(finish_code(end) == 1);
  CHECK_FALSE(has<action::StartWorkers>(end));
  CHECK(core.phase() == Phase::finished);
  CHECK(core.exit_code() == 1);
  CHECK(core.stop_reason() == StopReason::start_failed);
  CHECK(core.groups_started() == 0);
  CHECK(core.final_report() == FinalReport::none);  // the reason was said by whoever found it
  // Nothing follows a finished run.
  CHECK(core.on_worker_exit(0, code(1)).empty());
  CHECK(core.on_signal(SIGTERM).empty());
  CHECK(core.on_start_failed().empty());
}

TEST_CASE("a failed restart's start keeps the earlier starts counted", "[core]") {
  AgentCore core(1, 1);
  core.start();
  auto restart = core.on_worker_exit(0, code(1));
  REQUIRE(has<action::StartWorkers>(restart));
  CHECK(core.groups_started() == 2);
  CHECK(finish_code(core.on_start_failed()) == 1);
  CHECK(core.groups_started() == 1);
}

TEST_CASE("a start failure is only the attempt's just begun", "[core]") {
  AgentCore core(2, 0);
  CHECK(core.on_start_failed().empty());  // nothing begun
  core.start();
  core.on_worker_exit(0, ok());
  CHECK(core.on_start_failed().empty());  // its workers ran
  CHECK(core.phase() == Phase::running);
}

TEST_CASE("the core chooses the report that ends the run", "[core]") {
  SECTION("success: none") {
    AgentCore core(1, 0);
    core.start();
    core.on_worker_exit(0, ok());
    CHECK(core.exit_code() == 0);
    CHECK(core.final_report() == FinalReport::none);
  }
  SECTION("a local failure: this node's report") {
    AgentCore core(2, 0);
    core.start();
    core.on_worker_exit(1, code(2));
    core.on_worker_exit(0, sig(SIGTERM));
    CHECK(core.exit_code() == 1);
    CHECK(core.final_report() == FinalReport::local);
  }
  SECTION("the agent's signal: the signal, whatever the workers did") {
    AgentCore core(2, 0);
    core.start();
    core.on_worker_exit(1, code(2));
    core.on_signal(SIGTERM);
    core.on_worker_exit(0, sig(SIGTERM));
    CHECK(core.final_report() == FinalReport::signal);
  }
  SECTION("not finished yet: none") {
    AgentCore core(2, 0);
    core.start();
    core.on_worker_exit(1, code(2));
    CHECK(core.final_report() == FinalReport::none);
  }
  SECTION("multi-node: the job's root cause when the finish order names it") {
    AgentCore core(1, 0, true);
    core.on_assignment(0);
    core.on_worker_exit(0, code(1));  // reported; the rendezvous decides
    CHECK(finish_code(core.on_finish_order(1, true)) == 1);
    CHECK(core.final_report() == FinalReport::job);
  }
  SECTION("multi-node: workers stopped by an order without a named cause are victims") {
    AgentCore core(2, 0, true);
    core.on_assignment(0);
    core.on_finish_order(1);
    core.on_worker_exit(0, sig(SIGTERM));
    CHECK(finish_code(core.on_worker_exit(1, sig(SIGTERM))) == 1);
    CHECK(core.final_report() == FinalReport::none);
  }
  SECTION("multi-node: a local failure with no root cause named: this node's report") {
    AgentCore core(1, 0, true);
    core.on_assignment(0);
    core.on_worker_exit(0, code(1));
    CHECK(finish_code(core.on_finish_order(1)) == 1);
    CHECK(core.final_report() == FinalReport::local);
  }
}

TEST_CASE("Finish is always the last action of its list", "[core]") {
  {
    AgentCore core(2, 0);
    core.start();
    core.on_worker_exit(0, code(1));
    CHECK(core.on_shutdown_timer().size() == 2);  // SIGKILL, and the timer again
    auto end = core.on_shutdown_timer();
    CHECK(finish_code(end) == 1);
    CHECK(finish_is_last(end));
  }
  {
    AgentCore core(1, 0);
    core.start();
    auto end = core.on_worker_exit(0, code(1));
    CHECK(finish_code(end) == 1);
    CHECK(finish_is_last(end));
  }
  {
    AgentCore core(1, 0);
    auto end = core.on_signal(SIGINT);
    CHECK(finish_code(end) == 1);
    CHECK(finish_is_last(end));
  }
}

TEST_CASE("a failure while stacks are taken holds its SIGTERM and timer until the dump is done", "[core][stacks]") {
  AgentCore core(3, 1);
  core.start();
  CHECK(core.on_stacks_started().empty());
  auto fail = core.on_worker_exit(1, code(3));
  CHECK(has<action::HoldStop>(fail));
  CHECK_FALSE(has<action::SignalWorkers>(fail));
  CHECK_FALSE(has<action::ArmShutdownTimer>(fail));
  CHECK(has<action::AnnounceRestart>(fail));  // said when decided, not when the stop goes
  CHECK(core.phase() == Phase::stopping);
  auto done = core.on_stacks_done();
  REQUIRE(done.size() == 2);
  CHECK(std::get<action::SignalWorkers>(done[0]).signo == SIGTERM);
  CHECK_FALSE(std::get<action::ArmShutdownTimer>(done[1]).after_kill);
  CHECK(core.on_stacks_done().empty());  // sent once
  core.on_worker_exit(0, sig(SIGTERM));
  CHECK(has<action::StartWorkers>(core.on_worker_exit(2, sig(SIGTERM))));
}

TEST_CASE("an order or a hang while stacks are taken holds the stop, and a dump with no stop sends nothing",
          "[core][stacks]") {
  SECTION("a restart order") {
    AgentCore core(2, 3, true);
    core.on_assignment(0);
    core.on_stacks_started();
    auto order = core.on_restart_order(true);
    CHECK(has<action::HoldStop>(order));
    CHECK(has<action::AnnounceRestart>(order));
    CHECK_FALSE(has<action::SignalWorkers>(order));
    auto done = core.on_stacks_done();
    CHECK(has<action::SignalWorkers>(done));
    CHECK(has<action::ArmShutdownTimer>(done));
    core.on_worker_exit(0, sig(SIGTERM));
    auto down = core.on_worker_exit(1, sig(SIGTERM));
    REQUIRE(has<action::Rejoin>(down));
  }
  SECTION("a finish order") {
    AgentCore core(2, 0, true);
    core.on_assignment(0);
    core.on_stacks_started();
    auto order = core.on_finish_order(1, true);
    CHECK(order.size() == 1);
    CHECK(has<action::HoldStop>(order));
    CHECK(has<action::SignalWorkers>(core.on_stacks_done()));
  }
  SECTION("a rank taken for hung") {
    AgentCore core(2, 0, true);
    core.on_assignment(0);
    core.on_stacks_started();
    auto hung = core.on_worker_hung(1);
    CHECK(has<action::ReportFailure>(hung));
    CHECK(has<action::HoldStop>(hung));
    CHECK_FALSE(has<action::SignalWorkers>(hung));
    CHECK(has<action::SignalWorkers>(core.on_stacks_done()));
  }
  SECTION("no stop") {
    AgentCore core(2, 0);
    core.start();
    core.on_stacks_started();
    CHECK(core.on_stacks_done().empty());
    auto fail = core.on_worker_exit(0, code(1));  // after the dump: at once
    CHECK(has<action::SignalWorkers>(fail));
    CHECK_FALSE(has<action::HoldStop>(fail));
  }
}

TEST_CASE("a held stop is dropped once its workers are gone, and does not reach the next attempt",
          "[core][stacks]") {
  AgentCore core(2, 1);
  core.start();
  core.on_stacks_started();
  CHECK(has<action::HoldStop>(core.on_worker_exit(0, code(5))));
  // The last worker exits by itself before the dump ends: the group restarts.
  CHECK(has<action::StartWorkers>(core.on_worker_exit(1, code(6))));
  CHECK(core.on_stacks_done().empty());
  // The new attempt's failure, with no dump under way, stops at once.
  auto fail = core.on_worker_exit(1, code(7));
  CHECK(has<action::SignalWorkers>(fail));
  CHECK(has<action::ArmShutdownTimer>(fail));
}

TEST_CASE("a signal to the agent never waits for the stacks", "[core][stacks]") {
  SECTION("while the workers run") {
    AgentCore core(2, 0);
    core.start();
    core.on_stacks_started();
    auto s = core.on_signal(SIGINT);
    REQUIRE(s.size() == 2);
    CHECK(std::get<action::SignalWorkers>(s[0]).signo == SIGINT);
    CHECK(has<action::ArmShutdownTimer>(s));
    CHECK(core.on_stacks_done().empty());
  }
  SECTION("while a stop is held: its own signal and the held timer go now") {
    AgentCore core(2, 1);
    core.start();
    core.on_stacks_started();
    CHECK(has<action::HoldStop>(core.on_worker_exit(0, code(1))));
    auto s = core.on_signal(SIGTERM);
    REQUIRE(s.size() == 2);
    CHECK(std::get<action::SignalWorkers>(s[0]).signo == SIGTERM);
    CHECK(has<action::ArmShutdownTimer>(s));
    CHECK(core.on_stacks_done().empty());  // nothing left held
    CHECK(finish_code(core.on_worker_exit(1, sig(SIGTERM))) == 1);
    CHECK(core.final_report() == FinalReport::signal);
  }
}

TEST_CASE("overlapping dumps: a held stop waits for the last one to end", "[core][stacks]") {
  AgentCore core(2, 0);
  core.start();
  core.on_stacks_started();
  core.on_stacks_started();
  CHECK(has<action::HoldStop>(core.on_worker_exit(0, code(1))));
  CHECK(core.on_stacks_done().empty());  // one dump still under way
  CHECK(has<action::SignalWorkers>(core.on_stacks_done()));
  CHECK(core.on_stacks_done().empty());  // an unmatched end changes nothing
}
