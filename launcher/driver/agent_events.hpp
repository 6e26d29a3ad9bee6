// torch's agent events for --event-log-handler=console, one part of the
// driver: the Agent tells it what happened (an attempt's rendezvous and rank
// assignment timed, the workers started, the run ended) and it writes the
// records torch's agent and launcher would, in torch's order, through `say`.
// It is off unless the handler is console and LOGLEVEL lets INFO through.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "agent_core.hpp"
#include "event_log.hpp"
#include "failure_reporter.hpp"
#include "launch_config.hpp"
#include "worker_env.hpp"

namespace muster::launcher {

class AgentEvents {
 public:
  using Say = std::function<void(const std::string&)>;
  // A worker's pid as torch records it: the exited worker's, else the
  // running one's as the shim reported it (0 while not known).
  using PidOf = std::function<pid_t(int local_rank)>;

  AgentEvents(const LaunchConfig& cfg, const Environment& env, std::string host, Say say);

  bool enabled() const { return enabled_; }
  // The agent failed before any worker ran (a bad setting, a port in use).
  void agent_failed(const std::string& why);
  // An attempt begins: torch times its rendezvous (from `rendezvous_began`)
  // and then its rank assignment (from `assign_began`), in that order.
  void rendezvous_done(int restart_count, std::chrono::steady_clock::time_point rendezvous_began);
  void ranks_assigned(const GroupAssignment& group, std::chrono::steady_clock::time_point assign_began);
  // The attempt's workers were started: each one's START once all pids are known.
  void workers_started(const GroupAssignment& group, const PidOf& pid_of);
  // A worker's pid became known (the shim told it).
  void pid_known();
  // The run ended: every worker's outcome, then the agent's, as torch's agent
  // and launcher record them.
  void run_ended(const AgentCore& core, const FailureReporter& reporter, const PidOf& last_pid_of);
  // The entry point's path, once resolved (the events' entry_point field;
  // the command line's until then).
  void set_executable(std::string path) { executable_ = std::move(path); }

 private:
  void emit(const std::string& state, const std::string& source, const EventWorker* worker,
            const std::optional<std::string>& raw_error, const std::optional<double>& duration_ms);
  EventWorker worker(int local_rank) const;
  void start_events_when_known();

  bool enabled_ = false;
  Say say_;
  std::string role_;
  std::string host_;
  std::string rdzv_backend_;
  bool run_path_ = false;
  int nproc_ = 0;
  std::string executable_;
  std::chrono::steady_clock::time_point run_began_;
  EventGroup group_;
  GroupAssignment assignment_;
  PidOf pid_of_;
  bool start_pending_ = false;
  bool collecting_pids_ = false;  // reading a pid can report another: no nesting
  bool error_traits_added_ = false;
};

}  // namespace muster::launcher
