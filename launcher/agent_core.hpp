// The agent's life cycle as a state machine without I/O: it takes events
// (workers started, a worker exited, a signal arrived, the shutdown grace ran
// out) and answers with the actions the driver carries out. One worker
// failing stops the rest; the group restarts while restarts remain; all
// workers succeeding ends the run with 0.
#pragma once

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
// Coordinated (multi-node) mode: tell the rendezvous, which decides what follows.
struct ReportFailure {
  int local_rank = 0;
};
struct ReportSuccess {};
// Coordinated mode: every local worker is down after a stop.
struct WorkersStopped {};
}  // namespace action

using Action = std::variant<action::StartWorkers, action::SignalWorkers, action::ArmShutdownTimer,
                            action::CancelShutdownTimer, action::KillWorkers, action::AbandonWorkers,
                            action::ReportFailure, action::ReportSuccess, action::WorkersStopped, action::Finish>;

// waiting: coordinated mode, workers down, the rendezvous decides what is next.
enum class Phase { idle, running, stopping, waiting, finished };
enum class StopReason { none, failure, signal, ordered };

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
  // Coordinated mode: the rendezvous ordered the workers stopped (a restart,
  // or the job ending); WorkersStopped follows once they are down.
  std::vector<Action> on_stop_order();
  // Coordinated mode: the job is over; call once the workers are down.
  std::vector<Action> on_job_finished(int exit_code);
  std::vector<Action> on_worker_exit(int local_rank, ExitStatus status);
  std::vector<Action> on_signal(int signo);
  std::vector<Action> on_shutdown_timer();

  Phase phase() const { return phase_; }
  StopReason stop_reason() const { return reason_; }
  int restart_count() const { return restart_count_; }
  int remaining_restarts() const { return max_restarts_ - restart_count_; }
  std::optional<int> received_signal() const { return signal_; }
  // Failures of the attempt that ended the run (or of the current attempt).
  const std::vector<ObservedFailure>& failures() const { return failures_; }
  int live_workers() const { return live_; }

 private:
  std::vector<Action> after_exit();
  std::vector<Action> begin_attempt();

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
};

}  // namespace muster::launcher
