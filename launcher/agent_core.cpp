#include "agent_core.hpp"

#include <csignal>

namespace muster::launcher {

AgentCore::AgentCore(int nproc, int max_restarts, bool coordinated)
    : nproc_(nproc), max_restarts_(max_restarts), coordinated_(coordinated) {}

std::vector<Action> AgentCore::begin_attempt() {
  phase_ = Phase::running;
  reason_ = StopReason::none;
  alive_.assign(static_cast<std::size_t>(nproc_), true);
  live_ = nproc_;
  failures_.clear();
  kill_sent_ = false;
  return {action::StartWorkers{restart_count_}};
}

std::vector<Action> AgentCore::start() {
  if (phase_ != Phase::idle || coordinated_) return {};
  return begin_attempt();
}

std::vector<Action> AgentCore::on_assignment(int restart_count) {
  if (!coordinated_ || (phase_ != Phase::idle && phase_ != Phase::waiting)) return {};
  restart_count_ = restart_count;
  return begin_attempt();
}

std::vector<Action> AgentCore::on_stop_order() {
  if (!coordinated_) return {};
  switch (phase_) {
    case Phase::running:
      phase_ = Phase::stopping;
      reason_ = StopReason::ordered;
      return {action::SignalWorkers{SIGTERM}, action::ArmShutdownTimer{}};
    case Phase::idle:
    case Phase::waiting:
      phase_ = Phase::waiting;
      return {action::WorkersStopped{}};
    case Phase::stopping:
    case Phase::finished:
      return {};  // WorkersStopped comes when the stop in progress ends
  }
  return {};
}

std::vector<Action> AgentCore::on_job_finished(int exit_code) {
  if (phase_ == Phase::finished) return {};
  phase_ = Phase::finished;
  return {action::Finish{exit_code}};
}

std::vector<Action> AgentCore::on_worker_exit(int local_rank, ExitStatus status) {
  if (phase_ != Phase::running && phase_ != Phase::stopping) return {};
  if (local_rank < 0 || local_rank >= nproc_ || !alive_[static_cast<std::size_t>(local_rank)]) return {};
  alive_[static_cast<std::size_t>(local_rank)] = false;
  --live_;
  std::vector<Action> out;
  if (phase_ == Phase::running) {
    if (!status.success()) {
      failures_.push_back({local_rank, status, false});
      phase_ = Phase::stopping;
      reason_ = StopReason::failure;
      if (coordinated_) out.push_back(action::ReportFailure{local_rank});
      if (live_ > 0) {
        out.push_back(action::SignalWorkers{SIGTERM});
        out.push_back(action::ArmShutdownTimer{});
      }
    }
  } else if (!status.success()) {
    failures_.push_back({local_rank, status, true});
  }
  auto rest = after_exit();
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

std::vector<Action> AgentCore::after_exit() {
  if (live_ > 0) return {};
  if (phase_ == Phase::running) {  // every worker succeeded
    if (coordinated_) {
      phase_ = Phase::waiting;
      return {action::ReportSuccess{}};
    }
    phase_ = Phase::finished;
    return {action::Finish{0}};
  }
  std::vector<Action> out{action::CancelShutdownTimer{}};
  if (coordinated_ && reason_ != StopReason::signal) {
    phase_ = Phase::waiting;
    out.push_back(action::WorkersStopped{});
    return out;
  }
  if (reason_ == StopReason::failure && restart_count_ < max_restarts_) {
    ++restart_count_;
    auto start = begin_attempt();
    out.insert(out.end(), start.begin(), start.end());
    return out;
  }
  phase_ = Phase::finished;
  out.push_back(action::Finish{1});
  return out;
}

std::vector<Action> AgentCore::on_signal(int signo) {
  switch (phase_) {
    case Phase::idle:
    case Phase::waiting:
      signal_ = signo;
      reason_ = StopReason::signal;
      phase_ = Phase::finished;
      return {action::Finish{1}};
    case Phase::running:
      signal_ = signo;
      reason_ = StopReason::signal;
      phase_ = Phase::stopping;
      return {action::SignalWorkers{signo}, action::ArmShutdownTimer{}};
    case Phase::stopping:
      // A signal during a failure stop turns it into a shutdown: no restart.
      signal_ = signo;
      reason_ = StopReason::signal;
      return {action::SignalWorkers{signo}};
    case Phase::finished:
      return {};
  }
  return {};
}

std::vector<Action> AgentCore::on_shutdown_timer() {
  if (phase_ != Phase::stopping || live_ == 0) return {};
  if (!kill_sent_) {
    kill_sent_ = true;
    return {action::KillWorkers{}, action::ArmShutdownTimer{true}};
  }
  // Still not gone after SIGKILL: waiting longer could be forever.
  phase_ = Phase::finished;
  return {action::AbandonWorkers{}, action::Finish{1}};
}

}  // namespace muster::launcher
