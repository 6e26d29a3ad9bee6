// Starts the workers of one attempt, each under its shim, and reports each
// worker's exit the moment it happens: the shim's pidfd becomes readable in
// the event loop (no polling). Signals reach a worker's whole process group
// through its shim.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent_core.hpp"
#include "muster/common/status.hpp"
#include "output_pump.hpp"

namespace muster::launcher {

// Where one standard stream of a worker goes.
struct StreamPlan {
  enum class Mode { inherit, devnull, file, tee };
  Mode mode = Mode::inherit;
  std::string path;  // file and tee: the log file ("" with tee: console only)
  PumpTargets tee;   // tee: console, prefix, filters (the file's sink is filled in)
};

struct WorkerLaunch {
  int local_rank = 0;
  std::string path;                // resolved executable
  std::vector<std::string> argv;   // argv[0] included
  std::vector<std::string> envp;
  StreamPlan out;
  StreamPlan err;
  // The CPUs the worker is bound to, as sched_setaffinity's mask (empty: the agent's).
  std::vector<unsigned long> cpu_mask;
};

struct WorkerExit {
  int local_rank = 0;
  pid_t pid = 0;  // the worker's own PID (what the worker saw as getpid())
  ExitStatus status;
  // When the worker ended: as the shim saw it (before its clean-up), else
  // when the agent learned of it.
  std::chrono::system_clock::time_point when;
};

class Supervisor {
 public:
  using ExitHandler = std::function<void(const WorkerExit&)>;

  Supervisor(boost::asio::io_context& io, ExitHandler on_exit);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts every worker. On error the ones already started keep running: the
  // destructor takes them down.
  Status start(const std::vector<WorkerLaunch>& launches);
  // Sends signo to the process group of every worker still running.
  void signal_all(int signo);
  // The same for one worker.
  void signal_one(int local_rank, int signo);
  // The worker's PID (its shim's until the shim has reported it).
  pid_t worker_pid(int local_rank);
  // The worker's own PID once its shim has reported it, else 0.
  pid_t reported_pid(int local_rank);
  std::vector<int> running() const;
  // Called once per worker when its shim reports the worker's own PID.
  void on_worker_pid(std::function<void(int local_rank, pid_t pid)> fn) { on_pid_ = std::move(fn); }

 private:
  struct Worker;
  Worker* find(int local_rank);
  void watch(Worker& w);
  void on_shim_exit(Worker& w);
  void watch_pid(Worker& w);
  void read_pid(Worker& w);
  std::optional<std::chrono::system_clock::time_point> read_exit_time(Worker& w);
  void close_control(Worker& w);
  void deliver_if_drained(Worker& w);

  boost::asio::io_context& io_;
  ExitHandler on_exit_;
  std::function<void(int, pid_t)> on_pid_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// PATH lookup as execvp does it, against the PATH of the worker's environment.
Result<std::string> resolve_executable(const std::string& program, const std::string& path_env);

}  // namespace muster::launcher
