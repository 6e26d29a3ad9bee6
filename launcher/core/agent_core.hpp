// The agent's life cycle as a state machine without I/O: it takes events
// (workers started, a worker exited, a signal arrived, the shutdown grace ran
// out, the rendezvous ordered something) and answers with the actions the
// driver carries out. One worker failing stops the rest; the group restarts
// while restarts remain; all workers succeeding ends the run with 0.
//
// In a multi-node (coordinated) job the rendezvous decides what follows a
// stop: its orders (restart: re-form; finish with a code; fenced: this node
// was dropped) stop the workers, and once they are down the core says what
// the order meant (Rejoin, or Finish). A signal the agent received is the
// root cause of the stop it starts, whatever workers do after it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <variant>
#include <vector>

namespace muster::launcher {

// How a worker process ended.
struct ExitStatus {
  bool signaled = false;
  int value = 0;  // exit code, or the signal number when signaled

  bool success() const { return !signaled && value == 0; }
  // torchrun's exitcode: the code, or minus the signal.
  int torch_exitcode() const { return signaled ? -value : value; }
};

namespace action {
struct StartWorkers {
  int restart_count = 0;
};
// The group failed and will be restarted: torchrun's "Worker group FAILED.
// <left>/<max> attempts left" line, said when that is decided (the failure
// seen on one node; the rendezvous's counted restart order on many), not when
// the new workers start.
struct AnnounceRestart {
  int attempts_left = 0;
  int max_restarts = 0;
};
struct SignalWorkers {  // to every worker still running
  int signo = 0;
};
// Fires on_shutdown_timer: first after the grace period (SIGKILL what is left),
// then, after_kill, once more after the bounded wait for killed workers to go.
struct ArmShutdownTimer {
  bool after_kill = false;
};
struct CancelShutdownTimer {};
struct KillWorkers {};
struct Finish {
  int exit_code = 0;
};
// Workers that outlived SIGKILL (stuck in the kernel): name them, then give up on them.
struct AbandonWorkers {};
// A stop came while the workers' Python stacks are being taken: its signal and
// its shutdown timer wait for the dump (on_stacks_done); say so.
struct HoldStop {};
// Coordinated (multi-node) mode: tell the rendezvous, which decides what follows.
struct ReportFailure {
  int local_rank = 0;
};
struct ReportSuccess {};
// Coordinated mode: the workers are down after a restart order or a fence;
// join the rendezvous again.
struct Rejoin {
  bool fenced = false;  // dropped by the rendezvous: join as a newcomer
};
}  // namespace action

using Action = std::variant<action::StartWorkers, action::AnnounceRestart, action::SignalWorkers, action::ArmShutdownTimer,
                            action::CancelShutdownTimer, action::KillWorkers, action::AbandonWorkers,
                            action::HoldStop, action::ReportFailure, action::ReportSuccess, action::Rejoin,
                            action::Finish>;

// waiting: coordinated mode, workers down, the rendezvous decides what is next.
enum class Phase { idle, running, stopping, waiting, finished };
// ordered: the rendezvous's restart or finish order; fenced: this node was
// dropped (or fenced itself); lost: the rendezvous is gone for good;
// start_failed: the workers of an attempt could not be started.
enum class StopReason { none, failure, signal, ordered, fenced, lost, start_failed };

// The one report that ends a failed run (finish_report()): none for a run
// that succeeded, or whose workers were only stopped by the agent (the error
// that stopped them was said when it happened); the agent's signal; the
// job's root cause as the rendezvous named it; or this node's failures.
enum class FinalReport { none, signal, job, local };

// A worker that ended badly in the current attempt, in the order seen.
struct ObservedFailure {
  int local_rank = 0;
  ExitStatus status;
  bool stopped_by_agent = false;
};

class AgentCore {
 public:
  // coordinated: a multi-node job, where restarts and the end of the job are
  // the rendezvous's decisions, not this node's.
  AgentCore(int nproc, int max_restarts, bool coordinated = false);

  std::vector<Action> start();
  // Coordinated mode: the rendezvous assigned a round; start its workers.
  std::vector<Action> on_assignment(int restart_count);
  // Coordinated mode: the job re-forms; Rejoin once the workers are down.
  // counts_as_failure: the rendezvous counted this restart against --max-restarts.
  std::vector<Action> on_restart_order(bool counts_as_failure);
  // Coordinated mode: the job is over; Finish(exit_code) once the workers are
  // down. with_root_cause: the order names the job's root cause (a failure
  // on some node), which is then the report this node prints.
  std::vector<Action> on_finish_order(int exit_code, bool with_root_cause = false);
  // Coordinated mode: the rendezvous dropped this node, or the node could not
  // heartbeat for the dead-after window: its workers belong to a world that
  // goes on without them. Rejoin{fenced} once they are down.
  std::vector<Action> on_fenced();
  // Coordinated mode: the rendezvous is gone past the reconnect window.
  std::vector<Action> on_rendezvous_lost();
  // before_stop: it ended before the agent sent this attempt's stop signal
  // (by the shim's clock), so on its own, whatever stopped the group.
  std::vector<Action> on_worker_exit(int local_rank, ExitStatus status, bool before_stop = false);
  // --worker-timeout: the agent took the worker for hung and sent it SIGKILL.
  // It has failed from now on, as if it had died of SIGKILL, though its exit
  // is not seen yet (a worker stuck in the kernel may never exit): the others
  // are stopped, and the shutdown timer bounds the wait for all of them.
  std::vector<Action> on_worker_hung(int local_rank);
  std::vector<Action> on_signal(int signo);
  std::vector<Action> on_shutdown_timer();
  // The attempt that StartWorkers began could not start its workers (no
  // fork, a log file that cannot be opened, a port gone): the run ends with 1
  // and nothing restarts, as a start that fails would fail again. The reason
  // was said by whoever found it.
  std::vector<Action> on_start_failed();
  // The workers' Python stacks are being taken (a rank taken for hung, here or
  // on another node, or musterctl stacks), and then they are written. A stop
  // that a failure, a hang or an order brings meanwhile would destroy what the
  // dump reads: it holds its SIGTERM and its shutdown timer (HoldStop) until
  // the dump is done (the driver bounds it), and then sends them, unless the
  // workers are gone by then; its reports and the restart's announcement go at
  // once. A signal to the agent never waits: it sends its own, and the held
  // timer with it. Dumps may overlap: the stop waits for the last one's end.
  std::vector<Action> on_stacks_started();
  std::vector<Action> on_stacks_done();

  Phase phase() const { return phase_; }
  StopReason stop_reason() const { return reason_; }
  // A signal to the agent stopped (or is stopping) the workers: the agent is
  // on its way out, and nothing else is started or reported.
  bool stopped_by_signal() const { return reason_ == StopReason::signal; }
  int restart_count() const { return restart_count_; }
  bool coordinated() const { return coordinated_; }
  // The code the run ends with, once Finish was asked for.
  std::optional<int> exit_code() const { return exit_code_; }
  // Worker groups whose start succeeded, over the whole run.
  int groups_started() const { return groups_started_; }
  // Which report ends the run; meaningful once finished.
  FinalReport final_report() const;
  int remaining_restarts() const { return max_restarts_ - restart_count_; }
  std::optional<int> received_signal() const { return signal_; }
  // Failures of the attempt that ended the run (or of the current attempt).
  const std::vector<ObservedFailure>& failures() const { return failures_; }
  int live_workers() const { return live_; }
  // Whether the workers run under an assignment the rendezvous still counts
  // on (so losing the rendezvous must fence them).
  bool holds_workers() const { return phase_ == Phase::running || phase_ == Phase::stopping; }
  // Coordinated mode: ordered to finish (the job is over, or this node is out
  // of it); the connection to the rendezvous is no longer needed.
  bool finishing() const { return phase_ == Phase::finished || (then_ == Then::finish && phase_ != Phase::running); }

 private:
  enum class Then { wait, rejoin, rejoin_fenced, finish };
  std::vector<Action> after_exit();
  void announce_restart(std::vector<Action>& out) const;
  // SIGTERM to the workers and the shutdown timer, or HoldStop while stacks are taken.
  void stop_workers(std::vector<Action>& out);
  std::vector<Action> begin_attempt();
  std::vector<Action> order(Then then, int exit_code, StopReason reason);
  std::vector<Action> follow_order();
  // Every Finish goes out through here, and always last in its list: the
  // driver performs nothing after it.
  action::Finish finish(int exit_code);

  int nproc_;
  int max_restarts_;
  bool coordinated_;
  int restart_count_ = 0;
  Phase phase_ = Phase::idle;
  StopReason reason_ = StopReason::none;
  std::optional<int> signal_;
  std::vector<bool> alive_;
  int live_ = 0;
  std::vector<ObservedFailure> failures_;
  bool kill_sent_ = false;
  bool reported_late_ = false;  // a failure seen after a restart order was reported
  Then then_ = Then::wait;  // coordinated: what the last order asks for once the workers are down
  int then_exit_code_ = 1;
  bool job_root_cause_ = false;  // the finish order named the job's root cause
  int groups_started_ = 0;
  std::optional<int> exit_code_;
  int dumps_under_way_ = 0;  // on_stacks_started not yet matched by on_stacks_done
  bool stop_held_ = false;  // the current stop's SIGTERM and timer wait for the stacks
};

// The agent's view of its membership. The rendezvous counts a member gone
// once it has heard nothing from it for the dead-after window; the agent
// counts from the send time of its latest heartbeat that the rendezvous
// acknowledged, which is never later than when the rendezvous heard it, so
// the lease lapses here no later than the rendezvous drops the member.
class Lease {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Lease(std::chrono::milliseconds dead_after) : dead_after_(dead_after) {}

  void renew(Clock::time_point at);
  // A heartbeat numbered seq went out at `at`.
  void sent(uint64_t seq, Clock::time_point at);
  // The rendezvous acknowledged heartbeat seq: the lease runs from its send time.
  void acked(uint64_t seq);
  bool lapsed(Clock::time_point now) const { return now >= expires(); }
  Clock::time_point expires() const;
  std::chrono::milliseconds dead_after() const { return dead_after_; }

 private:
  static constexpr std::size_t kMaxInFlight = 1024;  // heartbeats awaiting an ack, oldest dropped
  std::chrono::milliseconds dead_after_;
  Clock::time_point renewed_{};
  std::deque<std::pair<uint64_t, Clock::time_point>> in_flight_;
};

}  // namespace muster::launcher
