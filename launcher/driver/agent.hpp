// The agent's driver: one event loop around AgentCore. It forms this node's
// group (alone, or through the rendezvous: agent_rendezvous.cpp and its
// RendezvousMember), turns the events of its parts (supervisor, signals,
// rendezvous member, store host, worker timeout, file timer) into core events and the core's actions into calls: the launch
// planner's launches to the Supervisor, signals to the workers, the shutdown
// grace timer, the failure reporter's report when the run fails.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent_core.hpp"
#include "agent_metrics.hpp"
#include "event_log.hpp"
#include "async_writer.hpp"
#include "failure_reporter.hpp"
#include "file_timer.hpp"
#include "worker_timeout.hpp"
#include "launch_config.hpp"
#include "launch_planner.hpp"
#include "rendezvous_host.hpp"
#include "rendezvous_member.hpp"
#include "store_host.hpp"
#include "signal_source.hpp"
#include "supervisor.hpp"
#include "worker_env.hpp"

namespace muster::launcher {

class Agent {
 public:
  // env: the agent's environment with its own additions already made.
  Agent(boost::asio::io_context& io, SignalSource& signals, LaunchConfig cfg, Environment env);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end; returns the agent's exit code.
  int run();
  // The agent's state for --metrics-listen, as of now.
  AgentMetrics metrics() const;

 private:
  Status form_group();
  void wait_for_signal();
  void on_signal(int signo);
  void apply(const std::vector<Action>& actions);
  void start_workers(int restart_count);
  void on_worker_exit(const WorkerExit& e);
  void finish(int exit_code);
  Status open_file_timer();
  // --event-log-handler=console (event_log.hpp).
  void emit_event(const std::string& state, const std::string& source, const EventWorker* worker,
                  const std::optional<std::string>& raw_error, const std::optional<double>& duration_ms);
  EventWorker event_worker(int local_rank) const;
  void emit_start_events_when_known();
  void emit_final_events(int exit_code);
  void on_timer_expired(const ExpiredWorker& w);
  // --worker-timeout (worker_timeout.hpp).
  void on_workers_silent(const std::vector<ProgressWatch::Silent>& silent);
  // Multi-node jobs (agent_rendezvous.cpp): the rendezvous's events.
  int run_coordinated();
  Status setup_rendezvous();
  void on_assigned(const rendezvous::out::Assign& a);
  void on_rendezvous_failed(const Status& st);
  bool shutting_down() const;
  void report_to_rendezvous_failure(int local_rank);
  // Text for the agent's stderr (errors, reports), through the writer.
  void say(const std::string& text);

  boost::asio::io_context& io_;
  SignalSource& signals_;
  LaunchConfig cfg_;
  Environment env_;
  AgentCore core_;
  // Before supervisor_: the workers' output pumps write through it.
  AsyncWriter writer_;
  LaunchPlanner planner_;  // the log layout, the run-path folder and each attempt's launches
  Supervisor supervisor_;
  boost::asio::steady_timer shutdown_timer_;
  GroupAssignment group_;
  std::string host_;
  FailureReporter reporter_;  // the attempt's record of each worker, and the failure report
  int last_stop_signal_ = 0;
  std::size_t dropped_log_lines_ = 0;
  // For metrics().
  uint64_t dropped_log_lines_total_ = 0;
  uint64_t worker_group_starts_ = 0;
  uint64_t worker_failures_ = 0;
  std::map<int, AgentMetrics::Exit> last_exits_;
  std::unique_ptr<FileTimerServer> file_timer_;
  std::unique_ptr<WorkerTimeout> worker_timeout_;
  // Events (--event-log-handler=console, shown at LOGLEVEL INFO or DEBUG, the default).
  bool events_ = false;
  EventGroup event_group_;
  bool start_events_pending_ = false;
  bool collecting_start_pids_ = false;  // reading a pid can report another: no nesting
  bool error_traits_added_ = false;
  std::chrono::steady_clock::time_point run_started_{};
  std::chrono::steady_clock::time_point rendezvous_started_{};
  int exit_code_ = 1;
  bool finished_ = false;

  // Multi-node state.
  bool coordinated_ = false;
  std::unique_ptr<RendezvousHost> rdzv_host_;
  // After worker_timeout_, which it tells of the workers' requests, and
  // rdzv_host_, to whose server its shared port hands connections: it goes first.
  StoreHost store_host_;
  // After store_host_, whose port it advertises: it goes before it.
  std::unique_ptr<RendezvousMember> member_;
  std::optional<rendezvous::FailureInfo> job_root_cause_;
};

}  // namespace muster::launcher
