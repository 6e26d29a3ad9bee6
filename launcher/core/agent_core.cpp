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
  reported_late_ = false;
  kill_sent_ = false;
  stop_held_ = false;
  ++groups_started_;  // taken back by on_start_failed
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

std::vector<Action> AgentCore::on_restart_order(bool counts_as_failure) {
  auto out = order(Then::rejoin, 1, StopReason::ordered);
  if (counts_as_failure && !out.empty() && restart_count_ < max_restarts_) {
    out.push_back(action::AnnounceRestart{max_restarts_ - restart_count_, max_restarts_});
  }
  return out;
}

std::vector<Action> AgentCore::on_finish_order(int exit_code, bool with_root_cause) {
  if (with_root_cause && coordinated_ && phase_ != Phase::finished) job_root_cause_ = true;
  return order(Then::finish, exit_code, StopReason::ordered);
}

std::vector<Action> AgentCore::on_fenced() { return order(Then::rejoin_fenced, 1, StopReason::fenced); }

std::vector<Action> AgentCore::on_rendezvous_lost() { return order(Then::finish, 1, StopReason::lost); }

std::vector<Action> AgentCore::order(Then then, int exit_code, StopReason reason) {
  if (!coordinated_ || phase_ == Phase::finished) return {};
  // A signal's shutdown is not turned into anything else.
  if (reason_ == StopReason::signal) return {};
  // An order to finish is not undone by a later order to re-form.
  if (then_ == Then::finish && then != Then::finish && phase_ == Phase::stopping) return {};
  then_ = then;
  then_exit_code_ = exit_code;
  switch (phase_) {
    case Phase::running: {
      phase_ = Phase::stopping;
      reason_ = reason;
      std::vector<Action> out;
      stop_workers(out);
      return out;
    }
    case Phase::idle:
    case Phase::waiting:
      if (reason_ == StopReason::none || reason_ == StopReason::ordered) reason_ = reason;
      return follow_order();
    case Phase::stopping:
      // The stop in progress ends in what this order asks for. The reason of
      // a stop already under way (a local failure) stays its root cause.
      if (reason_ == StopReason::ordered || reason == StopReason::lost) reason_ = reason;
      return {};
    case Phase::finished:
      return {};
  }
  return {};
}

std::vector<Action> AgentCore::follow_order() {
  Then then = then_;
  then_ = Then::wait;
  switch (then) {
    case Then::wait:
      phase_ = Phase::waiting;
      return {};
    case Then::rejoin:
    case Then::rejoin_fenced:
      phase_ = Phase::waiting;
      return {action::Rejoin{then == Then::rejoin_fenced}};
    case Then::finish:
      return {finish(then_exit_code_)};
  }
  return {};
}

std::vector<Action> AgentCore::on_worker_exit(int local_rank, ExitStatus status, bool before_stop) {
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
      if (live_ > 0) stop_workers(out);
      announce_restart(out);
    }
  } else if (!status.success()) {
    bool known = false;  // taken for hung before it exited: its failure is recorded already
    for (const auto& f : failures_) known = known || f.local_rank == local_rank;
    if (!known) failures_.push_back({local_rank, status, true});
    // It ended badly before this node's stop, which the rendezvous ordered for
    // another node's failure: a failure of that round too, and perhaps the
    // first (this agent may only have learned of it late). The rendezvous
    // weighs the report in its verdict; once per attempt is enough.
    if (!known && before_stop && coordinated_ && reason_ == StopReason::ordered && then_ != Then::finish &&
        !reported_late_) {
      reported_late_ = true;
      out.push_back(action::ReportFailure{local_rank});
    }
  }
  auto rest = after_exit();
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

std::vector<Action> AgentCore::on_worker_hung(int local_rank) {
  if (phase_ != Phase::running && phase_ != Phase::stopping) return {};
  if (local_rank < 0 || local_rank >= nproc_ || !alive_[static_cast<std::size_t>(local_rank)]) return {};
  for (const auto& f : failures_) {
    if (f.local_rank == local_rank) return {};
  }
  ExitStatus killed{true, SIGKILL};
  if (phase_ == Phase::stopping) {  // silent beside another failure: a failure of its own
    failures_.push_back({local_rank, killed, reason_ != StopReason::failure});
    return {};
  }
  failures_.push_back({local_rank, killed, false});
  phase_ = Phase::stopping;
  reason_ = StopReason::failure;
  std::vector<Action> out;
  if (coordinated_) out.push_back(action::ReportFailure{local_rank});
  stop_workers(out);
  announce_restart(out);
  return out;
}

void AgentCore::stop_workers(std::vector<Action>& out) {
  if (dumps_under_way_ > 0) {
    stop_held_ = true;
    out.push_back(action::HoldStop{});
    return;
  }
  out.push_back(action::SignalWorkers{SIGTERM});
  out.push_back(action::ArmShutdownTimer{});
}

std::vector<Action> AgentCore::on_stacks_started() {
  ++dumps_under_way_;
  return {};
}

std::vector<Action> AgentCore::on_stacks_done() {
  if (dumps_under_way_ > 0) --dumps_under_way_;
  if (dumps_under_way_ > 0 || !stop_held_) return {};
  stop_held_ = false;
  // The workers the stop was for may all be gone by now (the next attempt,
  // if any, began without a held stop).
  if (phase_ != Phase::stopping || live_ == 0) return {};
  return {action::SignalWorkers{SIGTERM}, action::ArmShutdownTimer{}};
}

void AgentCore::announce_restart(std::vector<Action>& out) const {
  // One node decides its restart itself; many learn it from the rendezvous's order.
  if (!coordinated_ && restart_count_ < max_restarts_) {
    out.push_back(action::AnnounceRestart{max_restarts_ - restart_count_, max_restarts_});
  }
}

std::vector<Action> AgentCore::after_exit() {
  if (live_ > 0) return {};
  if (phase_ == Phase::running) {  // every worker succeeded
    if (coordinated_) {
      phase_ = Phase::waiting;
      return {action::ReportSuccess{}};
    }
    return {finish(0)};
  }
  stop_held_ = false;  // nobody left to stop
  std::vector<Action> out{action::CancelShutdownTimer{}};
  if (coordinated_ && reason_ != StopReason::signal) {
    auto next = follow_order();
    out.insert(out.end(), next.begin(), next.end());
    return out;
  }
  if (reason_ == StopReason::failure && restart_count_ < max_restarts_) {
    ++restart_count_;
    auto start = begin_attempt();
    out.insert(out.end(), start.begin(), start.end());
    return out;
  }
  out.push_back(finish(1));
  return out;
}

std::vector<Action> AgentCore::on_signal(int signo) {
  switch (phase_) {
    case Phase::idle:
    case Phase::waiting:
      signal_ = signo;
      reason_ = StopReason::signal;
      return {finish(1)};
    case Phase::running:
      signal_ = signo;
      reason_ = StopReason::signal;
      phase_ = Phase::stopping;
      return {action::SignalWorkers{signo}, action::ArmShutdownTimer{}};
    case Phase::stopping: {
      // A signal during a failure stop turns it into a shutdown: no restart.
      signal_ = signo;
      reason_ = StopReason::signal;
      std::vector<Action> out{action::SignalWorkers{signo}};
      if (stop_held_) {  // the held stop's timer did not run yet: it does now
        stop_held_ = false;
        out.push_back(action::ArmShutdownTimer{});
      }
      return out;
    }
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
  return {action::AbandonWorkers{}, finish(1)};
}

std::vector<Action> AgentCore::on_start_failed() {
  // Only the attempt just begun, before any of its workers was seen to exit.
  if (phase_ != Phase::running || live_ != nproc_) return {};
  --groups_started_;
  reason_ = StopReason::start_failed;
  return {finish(1)};
}

action::Finish AgentCore::finish(int exit_code) {
  phase_ = Phase::finished;
  stop_held_ = false;
  exit_code_ = exit_code;
  return action::Finish{exit_code};
}

FinalReport AgentCore::final_report() const {
  if (phase_ != Phase::finished || exit_code_.value_or(1) == 0) return FinalReport::none;
  if (reason_ == StopReason::signal && signal_) return FinalReport::signal;
  if (coordinated_ && job_root_cause_) return FinalReport::job;
  for (const auto& f : failures_) {
    if (!f.stopped_by_agent) return FinalReport::local;
  }
  return FinalReport::none;
}

void Lease::renew(Clock::time_point at) {
  if (at > renewed_) renewed_ = at;
}

void Lease::sent(uint64_t seq, Clock::time_point at) {
  in_flight_.emplace_back(seq, at);
  if (in_flight_.size() > kMaxInFlight) in_flight_.pop_front();
}

void Lease::acked(uint64_t seq) {
  while (!in_flight_.empty() && in_flight_.front().first <= seq) {
    if (in_flight_.front().first == seq) renew(in_flight_.front().second);
    in_flight_.pop_front();
  }
}

Lease::Clock::time_point Lease::expires() const {
  if (renewed_ > Clock::time_point::max() - dead_after_) return Clock::time_point::max();
  return renewed_ + dead_after_;
}

}  // namespace muster::launcher
