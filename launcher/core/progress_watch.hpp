// --worker-timeout: a worker that shows no sign of progress for the timeout
// is taken for hung. What counts as progress (docs/hangs.md): a byte the
// worker writes to its stdout or stderr; a request on the store this agent
// hosts, over a connection the worker's own process holds; a request to the
// file-based watchdog's pipe (TORCHELASTIC_TIMER_FILE) from its pid.
//
// ProgressWatch is the bookkeeping (pure, its clock given); the agent feeds it
// and acts on what it finds silent. local_socket_owner maps a store
// connection's peer to a worker through /proc.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace muster::launcher {

// The smallest timeout taken, and how often a running group is checked at
// most: silence is measured to within a tenth of the timeout, never finer
// than kMinProgressCheck.
constexpr std::chrono::milliseconds kMinWorkerTimeout{100};
constexpr std::chrono::milliseconds kMinProgressCheck{50};
constexpr std::chrono::milliseconds kMaxProgressCheck{1000};

class ProgressWatch {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ProgressWatch(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // A new group of nproc workers, started now: each has made progress now.
  void start(int nproc, Clock::time_point now);
  void progress(int local_rank, Clock::time_point now);
  // Every watched worker: progress now (the agent itself was held up, so
  // what the workers did meanwhile is not known yet).
  void progress_all(Clock::time_point now);
  // A worker blocked on a stream muster cannot pass on yet (a full console)
  // is not silent: held from hold(true) until hold(false), which counts as
  // progress. Holds nest (two streams).
  void hold(int local_rank, bool held, Clock::time_point now);
  // An exited worker is no longer watched.
  void stop(int local_rank);
  // No group (stopped, or between attempts).
  void clear() {
    last_.clear();
    held_.clear();
  }

  struct Silent {
    int local_rank = 0;
    std::chrono::milliseconds silent_for{0};
  };
  // The watched workers silent for the timeout or longer, by local rank.
  std::vector<Silent> silent(Clock::time_point now) const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  // How often to look: a tenth of the timeout, within the bounds above.
  std::chrono::milliseconds check_interval() const;

 private:
  std::chrono::milliseconds timeout_;
  std::vector<std::optional<Clock::time_point>> last_;  // nullopt: not watched
  std::vector<int> held_;
};


// One row of /proc/net/tcp or /proc/net/tcp6, the fields used here.
struct TcpRow {
  int local_port = 0;
  int remote_port = 0;
  unsigned long long inode = 0;
};
// The rows of a /proc/net/tcp{,6} text; lines that do not parse are skipped.
std::vector<TcpRow> parse_proc_net_tcp(std::string_view text);

// Which of the candidates (local rank, pid) holds each local TCP socket whose
// own port is one of local_ports and whose peer's port is remote_port: the
// store connections workers opened, seen from the store's side as peer ports.
// Reads proc_root/net/tcp and tcp6 once, and proc_root/PID/fd of each
// candidate once. Returns local port -> local rank, for the ports found.
std::map<int, int> local_socket_owners(const std::vector<int>& local_ports, int remote_port,
                                       const std::vector<std::pair<int, pid_t>>& candidates,
                                       const std::string& proc_root = "/proc");

}  // namespace muster::launcher
