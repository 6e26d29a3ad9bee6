// The launch planner: turns the configuration and this node's group
// assignment into the worker launches of one attempt.
//
// Contract. resolve_executable() finds the worker program on PATH, once,
// before any attempt. prepare_attempt(n) creates the run's log directory at
// the first attempt (lazily, as torchrun does), empties attempt_<n> with a
// folder per local rank, opens the filtered logs, and for --run-path makes a
// fresh folder where finished workers wait for the node's others.
// launches() then gives each local rank its argv (with ${local_rank}
// substituted), its environment (worker_env.hpp) with its error file, and
// where its stdout and stderr go (-r/-t, the log files, --local-ranks-filter,
// the line prefix, the duplicate filters, the worker timeout's pumps).
// finish() closes and removes what the attempts opened. It touches the disk
// and the writer, never a worker.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "async_writer.hpp"
#include "launch_config.hpp"
#include "log_dir.hpp"
#include "supervisor.hpp"
#include "worker_env.hpp"
#include "worker_timeout.hpp"

namespace muster::launcher {

// The agent's console, as sinks of its writer: where inherited and tee'd
// worker output goes.
struct ConsoleSinks {
  AsyncWriter::Sink out;
  AsyncWriter::Sink err;
};

class LaunchPlanner {
 public:
  LaunchPlanner(const LaunchConfig& cfg, AsyncWriter& writer, ConsoleSinks console);
  ~LaunchPlanner();
  LaunchPlanner(const LaunchPlanner&) = delete;
  LaunchPlanner& operator=(const LaunchPlanner&) = delete;

  // The worker program, looked up on env's PATH (cfg.executable as given
  // before that).
  Status resolve_executable(const Environment& env);
  const std::string& executable_path() const { return executable_path_; }

  // The attempt's folder ("" when --log-dir is disabled), ready for launches().
  Result<std::string> prepare_attempt(int restart_count, const Environment& env);

  struct Worker {
    WorkerLaunch launch;
    std::string error_file;  // TORCHELASTIC_ERROR_FILE, "" without a log directory
  };
  // One per local rank. timeout: the worker timeout, whose pumps see every
  // byte of output; null without --worker-timeout.
  Result<std::vector<Worker>> launches(const Environment& env, const GroupAssignment& group,
                                       const std::string& attempt_dir, WorkerTimeout* timeout);

  // --run-path: whether the worker of this global rank has run its script to
  // the end and waits for the node's others.
  bool finished_run_path_script(int global_rank) const;

  // Closes the filtered logs (once written) and removes the run-path folder.
  void finish();

 private:
  void open_filtered_logs(const std::string& attempt_dir);
  void close_filtered_logs();
  void prepare_run_path_barrier(const Environment& env);
  void remove_run_path_barrier();

  const LaunchConfig& cfg_;
  AsyncWriter& writer_;
  ConsoleSinks console_;
  std::string executable_path_;
  std::optional<LogDirectory> logs_;
  AsyncWriter::Sink filtered_stdout_;  // the filtered logs, owned by the writer
  AsyncWriter::Sink filtered_stderr_;
  std::string run_path_done_dir_;
  // What the workers' environment gets besides the agent's (the run-path folder).
  std::map<std::string, std::string> extra_env_;
};

}  // namespace muster::launcher
