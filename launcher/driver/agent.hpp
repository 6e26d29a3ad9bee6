// The agent's driver: one event loop around AgentCore. It turns the events
// of its parts into core events and performs the core's actions; it decides
// nothing itself. The parts:
//   supervisor_      starts, signals and reaps the workers (workers/)
//   planner_         each attempt's launches: argv, environment, streams
//   reporter_        each worker's record and the failure report
//   events_          torch's event records (--event-log-handler)
//   console_         the agent's stderr: its log lines and messages
//   worker_timeout_  --worker-timeout; file_timer_: the file-based watchdog
//   store_host_      the workers' store
//   rdzv_host_, member_  a multi-node job's rendezvous (agent_rendezvous.cpp)
// The actions map to calls: StartWorkers to the planner and the supervisor,
// signals to the workers, the shutdown grace timer, reports to the
// rendezvous, and Finish to the report the core chose and the loop's end.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent_core.hpp"
#include "agent_events.hpp"
#include "agent_metrics.hpp"
#include "async_writer.hpp"
#include "console_log.hpp"
#include "failure_reporter.hpp"
#include "file_timer.hpp"
#include "health_check.hpp"
#include "launch_config.hpp"
#include "launch_planner.hpp"
#include "rendezvous_host.hpp"
#include "rendezvous_member.hpp"
#include "launcher_link.hpp"
#include "signal_source.hpp"
#include "stack_dump.hpp"
#include "store_host.hpp"
#include "supervisor.hpp"
#include "worker_env.hpp"
#include "worker_timeout.hpp"

namespace muster::launcher {

class Agent {
 public:
  // env: the agent's environment with its own additions already made.
  Agent(boost::asio::io_context& io, SignalSource& signals, LaunchConfig cfg, Environment env);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end; returns the agent's exit code. The output still
  // queued is written within --shutdown-timeout; what is not is dropped, and
  // said.
  int run();
  // An agent started by a launching command over ssh: that command's channel
  // (launcher_link.hpp), whose stop orders and end end the job as a signal.
  // silence: how long without a word from it means it is gone.
  void attach_launcher(net::UniqueFd channel, std::chrono::milliseconds silence);
  // The agent's state for --metrics-listen, as of now.
  AgentMetrics metrics() const;

 private:
  // The run, up to the core's Finish; its exit code.
  int run_job();
  bool finished() const { return core_.phase() == Phase::finished; }
  // A start-up step failed: nothing ran, the run ends with 1.
  int fail_start_up(const Status& st);
  Status form_group();
  Status open_file_timer();
  void wait_for_signal();
  void on_signal(int signo);
  void apply(const std::vector<Action>& actions);
  void start_workers(int restart_count);
  void on_worker_exit(const WorkerExit& e);
  void on_workers_silent(const std::vector<ProgressWatch::Silent>& silent);
  // Kills those of `silent` still running with the pid they had when taken for hung.
  void kill_hung(const std::vector<ProgressWatch::Silent>& silent, const std::map<int, pid_t>& pids);
  // The hung-worker paths: every worker's Python stacks first (when py-spy is
  // there), then `then` (the kill), on the loop.
  void open_stack_dump();
  void take_stacks_then(std::function<void()> then);
  // The rendezvous asks for this node's workers' stacks (another node's rank
  // hung, or musterctl stacks): into the log, nothing is killed.
  void take_requested_stacks(const std::string& reason);
  // Starts a dump of every running worker (none under way); `title` heads
  // each stack in the log; then the kills that wait for a dump.
  void start_dump(const std::string& title, bool for_report);
  // py-spy, found once: stacks_ (available() false when there is none).
  void find_py_spy();
  void record_stacks(const std::vector<StackDump::Stack>& stacks, const std::string& attempt_dir,
                     const std::string& title, bool for_report);
  // --health-check: `join` once the node's check passes (at once without one).
  void join_when_healthy(const std::string& reason, std::function<void()> join);
  void open_health_check();
  void arm_health_timer();
  void finish();
  // Multi-node jobs (agent_rendezvous.cpp): the rendezvous's events.
  int run_coordinated();
  Status setup_rendezvous();
  void on_assigned(const rendezvous::out::Assign& a);
  void on_rendezvous_failed(const Status& st);
  void report_to_rendezvous_failure(int local_rank);
  void say(const std::string& text) { console_.say(text); }

  boost::asio::io_context& io_;
  SignalSource& signals_;
  LaunchConfig cfg_;
  Environment env_;
  AgentCore core_;
  // Before everything that writes through it (the console, the pumps).
  AsyncWriter writer_;
  ConsoleSinks console_sinks_;
  ConsoleLog console_;
  LaunchPlanner planner_;
  Supervisor supervisor_;
  boost::asio::steady_timer shutdown_timer_;
  boost::asio::steady_timer health_timer_;  // --health-check-interval
  boost::asio::steady_timer exclusion_timer_;  // an excluded node's cooldown
  GroupAssignment group_;
  std::string host_;
  FailureReporter reporter_;
  AgentEvents events_;
  AgentCounters counters_;
  int last_stop_signal_ = 0;
  // When this attempt's first stop signal went out (none yet: unset): a
  // worker that ended before it ended on its own.
  std::optional<std::chrono::system_clock::time_point> stop_sent_at_;
  std::chrono::steady_clock::time_point rendezvous_began_{};  // one node: when the attempt's "rendezvous" began
  std::unique_ptr<FileTimerServer> file_timer_;
  std::unique_ptr<WorkerTimeout> worker_timeout_;
  std::unique_ptr<StackDump> stacks_;  // with a watchdog: py-spy, or none
  std::unique_ptr<HealthCheck> health_;  // with --health-check
  std::unique_ptr<LauncherLink> launcher_;  // started over ssh by muster --hostfile
  std::string attempt_dir_;            // the current attempt's log folder ("" without one)
  std::string stacks_where_;           // where the last stacks went, for the final report
  bool stacks_hint_said_ = false;      // "install py-spy", once
  std::vector<std::function<void()>> after_stacks_;  // the kills that wait for the dump under way

  // Multi-node state.
  std::unique_ptr<RendezvousHost> rdzv_host_;
  // After worker_timeout_, which it tells of the workers' requests, and
  // rdzv_host_, to whose server its shared port hands connections: it goes first.
  StoreHost store_host_;
  // After store_host_, whose port it advertises: it goes before it.
  std::unique_ptr<RendezvousMember> member_;
  std::optional<rendezvous::FailureInfo> job_root_cause_;
};

}  // namespace muster::launcher
