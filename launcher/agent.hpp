// The agent's driver: one event loop around AgentCore. It forms this node's
// group (alone, or through the rendezvous: agent_rendezvous.cpp), turns the
// events of its parts (supervisor, signals, store host, worker timeout, file
// timer) into core events and the core's actions into calls: the launch
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
#include "muster/rendezvous/client.hpp"
#include "muster/rendezvous/server.hpp"
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
  // Multi-node jobs (agent_rendezvous.cpp).
  int run_coordinated();
  Status setup_rendezvous();
  void on_connected();
  rendezvous::JoinMessage join_message() const;
  void send_join();
  void send_resume();
  void on_rendezvous_message(const nlohmann::json& m);
  void on_rendezvous_error(const Status& st);
  void on_rendezvous_lost(const Status& st);
  void heartbeat_loop();
  void arm_lease_timer();
  void check_lease();
  void fence(const std::string& why);
  bool shutting_down() const;
  bool within_stale_connection_window();
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
  std::shared_ptr<rendezvous::RendezvousClient> rdzv_;
  std::optional<rendezvous::auth::Key> auth_key_;
  std::unique_ptr<rendezvous::RendezvousServer> rdzv_server_;
  // After worker_timeout_, which it tells of the workers' requests, and
  // rdzv_server_, to which its shared port hands connections: it goes first.
  StoreHost store_host_;
  rendezvous::Settings rdzv_settings_;
  rendezvous::Duration reconnect_timeout_{60000};
  std::string node_address_;
  std::string node_name_;  // this agent's identity: "<address>_<random instance id>"
  bool is_host_ = false;
  int round_ = -1;
  // The assignment the workers run under, while the rendezvous counts on it;
  // with how they ended once they did (sent again when resuming).
  std::optional<rendezvous::out::Assign> assignment_;
  std::optional<rendezvous::Resume::Outcome> outcome_;
  std::optional<rendezvous::FailureInfo> outcome_failure_;
  bool join_pending_ = false;  // a join is due or sent and not yet answered with an assignment
  int known_round_ = 0;        // the round the next join is for, as last heard
  int known_restart_count_ = 0;
  std::optional<Lease> lease_;
  uint64_t heartbeat_seq_ = 0;
  boost::asio::steady_timer heartbeat_timer_;
  boost::asio::steady_timer lease_timer_;
  std::chrono::steady_clock::time_point last_progress_note_{};
  bool reconnecting_ = false;  // the connection broke and has not come back yet
  std::chrono::steady_clock::time_point join_sent_at_{};  // the latest join or resume
  std::chrono::steady_clock::time_point last_heard_{};    // the latest message from the rendezvous
  std::optional<std::chrono::steady_clock::time_point> already_exists_since_;
  boost::asio::steady_timer retry_timer_;
  std::optional<rendezvous::FailureInfo> job_root_cause_;
};

}  // namespace muster::launcher
