// --worker-timeout on the agent's event loop: feeds a ProgressWatch from the
// workers' output pumps, the store this agent hosts and the file-based
// watchdog's pipe, looks at it every check_interval(), and hands the silent
// workers to the agent, which stops them as failed (docs/hangs.md).
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

// Store connections remembered as a worker's or as none: at most this many
// per attempt (a worker opening more is still watched through its output).
constexpr std::size_t kMaxWatchedStoreConnections = 4096;

class WorkerTimeout {
 public:
  using Workers = std::function<std::vector<std::pair<int, pid_t>>()>;  // running: (local rank, pid)
  using OnSilent = std::function<void(const std::vector<ProgressWatch::Silent>&)>;

  WorkerTimeout(boost::asio::io_context& io, std::chrono::milliseconds timeout, Workers workers, OnSilent on_silent);
  ~WorkerTimeout();
  WorkerTimeout(const WorkerTimeout&) = delete;
  WorkerTimeout& operator=(const WorkerTimeout&) = delete;

  // A group of nproc workers started now; the checks run until stop().
  void start(int nproc);
  void stop();
  void exited(int local_rank) { watch_.stop(local_rank); }

  // What an output pump of this group calls on each read (a later group's
  // pumps are not confused with it).
  std::function<void()> output_of(int local_rank);
  // A request on the store this agent hosts; store_port is that store's port.
  void store_request(std::uint64_t conn, const boost::asio::ip::tcp::endpoint& peer, int store_port);
  // A valid request on the file-based watchdog's pipe, naming pid.
  void timer_request(pid_t pid);
  std::chrono::milliseconds timeout() const { return watch_.timeout(); }

 private:
  void arm();
  bool is_local(const boost::asio::ip::address& a) const;

  boost::asio::io_context& io_;
  ProgressWatch watch_;
  Workers workers_;
  OnSilent on_silent_;
  boost::asio::steady_timer timer_;
  std::uint64_t generation_ = 0;
  bool running_ = false;
  std::unordered_map<std::uint64_t, int> store_conns_;  // connection -> local rank, or -1: none of ours
  std::vector<boost::asio::ip::address> own_addresses_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
