// torchrun's file-based worker watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1):
// workers write timer requests to a named pipe (TORCHELASTIC_TIMER_FILE) with
// torch.distributed.elastic.timer.FileTimerClient, one JSON object per line:
//   {"version": 1, "pid": P, "scope_id": S, "expiration_time": T, "signal": N}
// T is a wall-clock time in seconds since the epoch; a negative T releases
// (P, S). When a timer expires, the agent sends the worker its signal (the
// first with a signal > 0 among its expired timers, in expiration order; none
// with signal <= 0 kills) and forgets its timers; the worker's death then
// fails the group as any other would, and the group restarts while restarts
// remain. docs/architecture.md ("Hung workers") has the rest.
//
// FileTimerTable is the bookkeeping (pure); FileTimerServer the named pipe and
// the timer on the agent's event loop.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "line_splitter.hpp"
#include "muster/common/status.hpp"
#include "muster/net/unique_fd.hpp"

namespace muster::launcher {

// A request is at most PIPE_BUF bytes (FileTimerClient refuses longer ones,
// so the pipe's writes stay atomic); a longer line is malformed.
constexpr std::size_t kMaxTimerRequestBytes = 4096;
// Timers held at once, and the bytes of their scope names together: a worker
// that acquires without releasing cannot make the agent's memory grow past
// about 12 MiB; requests beyond either are refused.
constexpr std::size_t kMaxTimers = 65536;
constexpr std::size_t kMaxTimerScopeBytes = 8 << 20;

struct TimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // seconds since the epoch; < 0: release
  int signal = 0;              // <= 0: expire without killing
};

// One line of the pipe, validated: what it must hold and nothing else trusted.
Result<TimerRequest> parse_timer_request(std::string_view line);

struct ExpiredWorker {
  pid_t pid = 0;
  int signal = 0;  // 0: its expired timers carry no signal (it is not killed)
  std::vector<std::string> scopes;  // every expired scope, in expiration order
};

class FileTimerTable {
 public:
  // Registers or releases; false when the table is full (the request is dropped).
  bool apply(const TimerRequest& r);
  // Every worker with a timer at or before now (all of its expired timers are
  // dropped); by pid.
  std::vector<ExpiredWorker> take_expired(double now);
  // The earliest expiration held.
  std::optional<double> next_expiration() const;
  void forget(pid_t pid);
  void clear() {
    timers_.clear();
    expirations_.clear();
    scope_bytes_ = 0;
  }
  std::size_t size() const { return timers_.size(); }

 private:
  struct Timer {
    double expiration_time = 0;
    int signal = 0;
  };
  using Map = std::map<std::pair<pid_t, std::string>, Timer>;
  Map::iterator erase(Map::iterator it);
  Map timers_;  // the scope is kept once, in the key
  std::multiset<double> expirations_;  // the timers' expirations: the earliest in O(1), kept with timers_
  std::size_t scope_bytes_ = 0;
};

// Whose timer expired: the local rank of the running worker that is pid, or
// whose session pid belongs to (sid: pid's session, -1 if unknown; a worker
// leads its session, so what it started without leaving it is its own);
// -1 when pid is none of running's (local rank, pid), which is then ignored.
int expired_timer_owner(pid_t pid, pid_t sid, const std::vector<std::pair<int, pid_t>>& running);

// The file timer's rule, in two steps so the workers' stacks can be taken in
// between: claim_expired_timer() finds whose timer it is and holds that
// process by a pidfd (so a pid reused in between is never signalled); a pid
// that is none of `running`'s workers is left alone, and a timer without a
// signal only said (both logged): nullopt. send_timer_signal() then sends the
// signal the worker asked for, logged.
struct TimerKill {
  ExpiredWorker worker;
  int local_rank = -1;
  std::string scopes;  // printable, for the log
  net::UniqueFd pidfd;
};
std::optional<TimerKill> claim_expired_timer(const ExpiredWorker& w, const std::vector<std::pair<int, pid_t>>& running);
void send_timer_signal(const TimerKill& kill);

class FileTimerServer {
 public:
  // Called for each worker whose timer expired; the owner decides whether the
  // pid is one of its workers and signals it.
  using OnExpired = std::function<void(const ExpiredWorker&)>;

  // Makes the named pipe at path (mode 0600, replacing what is there, as
  // torch's server does) and starts reading it.
  static Result<std::unique_ptr<FileTimerServer>> open(boost::asio::io_context& io, const std::string& path,
                                                       OnExpired on_expired);
  ~FileTimerServer();  // closes and removes the pipe
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  // A new worker group: the old workers' timers mean nothing now.
  void clear();
  // A worker that exited: its timers go with it.
  void forget(pid_t pid) { table_.forget(pid); }
  const std::string& path() const { return path_; }
  // Called with the pid each valid request names (--worker-timeout counts it
  // as that worker's progress).
  void on_request(std::function<void(pid_t)> fn) { on_request_ = std::move(fn); }

 private:
  FileTimerServer(boost::asio::io_context& io, std::string path, OnExpired on_expired);
  void read();
  void on_line(std::string_view line, bool complete);
  void arm();
  void check();
  void bad_request(const std::string& why);

  std::string path_;
  OnExpired on_expired_;
  std::function<void(pid_t)> on_request_;
  boost::asio::posix::stream_descriptor pipe_;
  net::UniqueFd keep_open_fd_;  // our own writer, so the pipe never reads as ended
  dev_t dev_ = 0;          // the pipe made, so the one removed at the end is ours
  ino_t ino_ = 0;
  boost::asio::steady_timer timer_;
  LineSplitter lines_{kMaxTimerRequestBytes + 1};
  bool discarding_ = false;  // inside an over-long line: its rest is no request
  FileTimerTable table_;
  char buf_[8192];
  std::uint64_t bad_requests_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
