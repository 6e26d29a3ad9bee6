// --worker-timeout on the agent's event loop: feeds a ProgressWatch from the
// workers' output pumps, the store this agent hosts and the file-based
// watchdog's pipe, looks at it every check_interval(), and hands the silent
// workers to the agent, which fails them (docs/hangs.md).
//
// Store requests are attributed lazily: a request over a connection from this
// machine that is not known to be a worker's only records its time; only when
// some worker looks silent are such connections looked up in /proc (once per
// check, all of them in one pass), so the store's own loop never reads /proc
// and never waits on it for a request. Connections from other machines are
// not remembered at all.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "progress_watch.hpp"

namespace muster::launcher {

// Connections from this machine remembered per attempt (a worker's, or not
// known yet): past this, new ones are not followed (a worker is still watched
// through its output). A closed connection is forgotten.
constexpr std::size_t kMaxWatchedStoreConnections = 4096;

// The log line for workers taken for hung: each one's rank, local rank, pid
// and silence, and what was not heard from them within the timeout.
// pid_of: a running worker's pid.
std::string hang_text(const std::vector<ProgressWatch::Silent>& silent, int base_global_rank,
                      const std::function<pid_t(int)>& pid_of, std::chrono::milliseconds timeout);

class WorkerTimeout {
 public:
  using Workers = std::function<std::vector<std::pair<int, pid_t>>()>;  // running: (local rank, pid)
  using OnSilent = std::function<void(const std::vector<ProgressWatch::Silent>&)>;

  WorkerTimeout(boost::asio::io_context& io, std::chrono::milliseconds timeout, Workers workers, OnSilent on_silent);
  ~WorkerTimeout();
  WorkerTimeout(const WorkerTimeout&) = delete;
  WorkerTimeout& operator=(const WorkerTimeout&) = delete;

  // The callbacks for the output pumps of the group that the next start()
  // begins (a later group's pumps are not confused with it): a read that
  // brought bytes, and a stream held back by a full sink (true) or let go.
  std::function<void()> output_of(int local_rank);
  std::function<void(bool)> blocked_of(int local_rank);
  // A group of nproc workers started now; the checks run until stop().
  void start(int nproc);
  void stop();
  void exited(int local_rank) { watch_.stop(local_rank); }

  // A request on a store this agent hosts (listening on store_port), over
  // connection conn from peer; and that connection's end.
  void store_request(std::uint64_t conn, const boost::asio::ip::tcp::endpoint& peer, int store_port);
  void store_closed(std::uint64_t conn, int store_port);
  // A valid request on the file-based watchdog's pipe, naming pid.
  void timer_request(pid_t pid);
  std::chrono::milliseconds timeout() const { return watch_.timeout(); }

 private:
  struct StoreConn {
    int owner = -1;  // local rank, -1 while not known
    int peer_port = 0;
    int store_port = 0;
    ProgressWatch::Clock::time_point last{};  // the last request while not known
  };
  void arm();
  void check();
  void attribute_store_connections();
  bool is_local(const boost::asio::ip::address& a) const;
  static std::uint64_t key(std::uint64_t conn, int store_port) {
    return (static_cast<std::uint64_t>(store_port) << 48) | (conn & ((std::uint64_t{1} << 48) - 1));
  }

  ProgressWatch watch_;
  Workers workers_;
  OnSilent on_silent_;
  boost::asio::steady_timer timer_;
  std::uint64_t generation_ = 0;
  bool running_ = false;
  ProgressWatch::Clock::time_point last_check_{};
  std::unordered_map<std::uint64_t, StoreConn> store_conns_;
  std::vector<boost::asio::ip::address> own_addresses_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
