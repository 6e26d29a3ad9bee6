#include "agent_events.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <vector>

namespace muster::launcher {
namespace {

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

AgentEvents::AgentEvents(const LaunchConfig& cfg, const Environment& env, std::string host, Say say)
    : say_(std::move(say)),
      role_(cfg.role),
      host_(std::move(host)),
      rdzv_backend_(cfg.rdzv_backend),
      run_path_(cfg.run_path),
      nproc_(cfg.nproc_per_node),
      executable_(cfg.executable),
      run_began_(std::chrono::steady_clock::now()) {
  // torch's event loggers run at LOGLEVEL, INFO when it is unset; events are
  // recorded at INFO.
  std::string level = env_or(env, "LOGLEVEL", "INFO");
  for (auto& c : level) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  enabled_ = cfg.event_log_handler == "console" && (level == "INFO" || level == "DEBUG" || level == "NOTSET");
  assignment_.run_id = cfg.rdzv_id;
}

void AgentEvents::emit(const std::string& state, const std::string& source, const EventWorker* worker,
                       const std::optional<std::string>& raw_error, const std::optional<double>& duration_ms) {
  EventJob job;
  job.run_id = assignment_.run_id;
  job.role = role_;
  job.hostname = host_;
  job.rdzv_backend = rdzv_backend_;
  // torch: os.path.basename of the executable, or the function's name.
  job.entry_point = run_path_ ? "run_script_path" : executable_.substr(executable_.find_last_of('/') + 1);
  say_(format_event(state, source, job, group_, worker, raw_error, duration_ms) + "\n");
}

EventWorker AgentEvents::worker(int local_rank) const {
  EventWorker w;
  w.local_rank = local_rank;
  w.global_rank = assignment_.base_global_rank + local_rank;
  w.role_rank = assignment_.base_role_rank + local_rank;
  w.role_world_size = assignment_.role_world_size;
  return w;
}

void AgentEvents::agent_failed(const std::string& why) {
  if (enabled_) emit("FAILED", "AGENT", nullptr, why, std::nullopt);
}

void AgentEvents::rendezvous_done(int restart_count, std::chrono::steady_clock::time_point rendezvous_began) {
  group_.agent_restarts = restart_count;
  if (enabled_) emit("RENDEZVOUS", "AGENT", nullptr, std::nullopt, ms_since(rendezvous_began));
}

void AgentEvents::ranks_assigned(const GroupAssignment& group, std::chrono::steady_clock::time_point assign_began) {
  assignment_ = group;
  if (enabled_) emit("ASSIGN_WORKER_RANKS", "AGENT", nullptr, std::nullopt, ms_since(assign_began));
  group_.group_rank = group.group_rank;
  group_.group_world_size = group.group_world_size;
}

void AgentEvents::workers_started(const GroupAssignment& group, const PidOf& pid_of) {
  assignment_ = group;
  pid_of_ = pid_of;
  start_pending_ = enabled_;
  start_events_when_known();
}

void AgentEvents::pid_known() { start_events_when_known(); }

// torch records each worker's START once all of them run, with its pid as its id.
void AgentEvents::start_events_when_known() {
  if (!start_pending_ || collecting_pids_ || !pid_of_) return;
  collecting_pids_ = true;
  std::vector<pid_t> pids;
  for (int lr = 0; lr < nproc_; ++lr) pids.push_back(pid_of_(lr));
  collecting_pids_ = false;
  if (std::find(pids.begin(), pids.end(), 0) != pids.end()) return;
  start_pending_ = false;
  for (int lr = 0; lr < nproc_; ++lr) {
    EventWorker w = worker(lr);
    w.worker_id = std::to_string(pids[static_cast<std::size_t>(lr)]);
    emit("START", "WORKER", &w, std::nullopt, std::nullopt);
  }
}

// A signal (or a failure before any worker ran) is the agent's FAILED alone.
void AgentEvents::run_ended(const AgentCore& core, const FailureReporter& reporter, const PidOf& last_pid_of) {
  if (!enabled_) return;
  start_events_when_known();
  start_pending_ = false;  // a worker whose pid never came: no START for it
  group_.total_run_time =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - run_began_).count();
  if (core.stopped_by_signal() && core.received_signal()) {
    emit("FAILED", "AGENT", nullptr,
         "SignalException: Process " + std::to_string(getpid()) +
             " got signal: " + std::to_string(*core.received_signal()),
         std::nullopt);
    return;
  }
  if (core.groups_started() == 0) {
    emit("FAILED", "AGENT", nullptr, std::string("the workers could not be started"), std::nullopt);
    return;
  }
  std::map<int, const ObservedFailure*> failed;
  for (const auto& f : core.failures()) failed[f.local_rank] = &f;
  // torch builds every failure before it records any, on one shared dictionary
  // for those without an error file: once one of them carries the errorTraits,
  // all of them do. So: a first pass that only learns that.
  for (const auto& [lr, f] : failed) {
    failure_raw_error(reporter.error_file(lr), f->status.torch_exitcode(), error_traits_added_);
  }
  const bool succeeded = core.exit_code().value_or(1) == 0;
  for (int lr = 0; lr < nproc_; ++lr) {
    EventWorker w = worker(lr);
    pid_t pid = last_pid_of(lr);
    w.worker_id = std::to_string(pid);
    auto f = failed.find(lr);
    if (f != failed.end()) {
      int code = f->second->status.torch_exitcode();
      w.exit_code = code;
      w.worker_pid = pid;
      emit("FAILED", "WORKER", &w, failure_raw_error(reporter.error_file(lr), code, error_traits_added_), std::nullopt);
    } else {
      // A worker the agent stopped for another's failure (torch: TERMINATED).
      emit(succeeded ? "SUCCEEDED" : "TERMINATED", "WORKER", &w, std::nullopt, std::nullopt);
    }
  }
  emit("SUCCEEDED", "AGENT", nullptr, std::nullopt, std::nullopt);
}

}  // namespace muster::launcher
