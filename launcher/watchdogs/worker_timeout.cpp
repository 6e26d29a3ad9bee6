#include "worker_timeout.hpp"

#include <algorithm>

#include "muster/common/duration.hpp"
#include "muster/net/interfaces.hpp"

namespace muster::launcher {

namespace {

using Clock = ProgressWatch::Clock;

}  // namespace

WorkerTimeout::WorkerTimeout(boost::asio::io_context& io, std::chrono::milliseconds timeout, Workers workers,
                             OnSilent on_silent)
    : watch_(timeout), workers_(std::move(workers)), on_silent_(std::move(on_silent)), timer_(io) {}

WorkerTimeout::~WorkerTimeout() {
  *alive_ = false;
  timer_.cancel();
}

std::function<void()> WorkerTimeout::output_of(int local_rank) {
  // The pump may outlive this group, and this object (the agent's member) the pump.
  std::weak_ptr<bool> alive = alive_;
  std::uint64_t generation = generation_ + 1;  // the group start() begins next
  return [this, alive, generation, local_rank] {
    if (alive.expired() || generation != generation_) return;
    watch_.progress(local_rank, Clock::now());
  };
}

std::function<void(bool)> WorkerTimeout::blocked_of(int local_rank) {
  std::weak_ptr<bool> alive = alive_;
  std::uint64_t generation = generation_ + 1;
  return [this, alive, generation, local_rank](bool blocked) {
    if (alive.expired() || generation != generation_) return;
    watch_.hold(local_rank, blocked, Clock::now());
  };
}

void WorkerTimeout::start(int nproc) {
  ++generation_;
  running_ = true;
  store_conns_.clear();
  own_addresses_ = net::interface_addresses();
  last_check_ = Clock::now();
  watch_.start(nproc, last_check_);
  arm();
}

void WorkerTimeout::stop() {
  running_ = false;
  ++generation_;
  watch_.clear();
  store_conns_.clear();
  timer_.cancel();
}

bool WorkerTimeout::is_local(const boost::asio::ip::address& a) const {
  auto plain = a;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    plain = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
  }
  if (plain.is_loopback()) return true;
  return std::any_of(own_addresses_.begin(), own_addresses_.end(),
                     [&](const auto& own) { return own == plain || own == a; });
}

void WorkerTimeout::store_request(std::uint64_t conn, const boost::asio::ip::tcp::endpoint& peer, int store_port) {
  if (!running_) return;
  auto now = Clock::now();
  auto it = store_conns_.find(key(conn, store_port));
  if (it == store_conns_.end()) {
    // Another machine's process is none of this node's workers.
    if (store_conns_.size() >= kMaxWatchedStoreConnections || !is_local(peer.address())) return;
    it = store_conns_.emplace(key(conn, store_port), StoreConn{-1, peer.port(), store_port, now}).first;
  }
  if (it->second.owner >= 0) watch_.progress(it->second.owner, now);
  else it->second.last = now;
}

void WorkerTimeout::store_closed(std::uint64_t conn, int store_port) { store_conns_.erase(key(conn, store_port)); }

void WorkerTimeout::timer_request(pid_t pid) {
  if (!running_) return;
  for (const auto& [local_rank, worker] : workers_()) {
    if (worker == pid) watch_.progress(local_rank, Clock::now());
  }
}

// Every connection not known yet, looked up at once: its owner, if it is a
// worker's, gets the time of the connection's last request.
void WorkerTimeout::attribute_store_connections() {
  std::map<int, std::vector<int>> by_store;  // store port -> peer ports to look up
  for (const auto& [k, c] : store_conns_) {
    if (c.owner < 0) by_store[c.store_port].push_back(c.peer_port);
  }
  if (by_store.empty()) return;
  auto workers = workers_();
  for (const auto& [store_port, peers] : by_store) {
    auto owners = local_socket_owners(peers, store_port, workers);
    for (auto& [k, c] : store_conns_) {
      if (c.owner >= 0 || c.store_port != store_port) continue;
      if (auto o = owners.find(c.peer_port); o != owners.end()) {
        c.owner = o->second;
        watch_.progress(c.owner, c.last);
      }
    }
  }
}

void WorkerTimeout::check() {
  auto now = Clock::now();
  auto gap = now - last_check_;
  last_check_ = now;
  // The agent itself was held up (stopped, starved): output waiting in the
  // pipes has not been read yet, so nobody's silence is known. Start over.
  if (gap > 2 * watch_.check_interval() + std::chrono::milliseconds(100)) {
    watch_.progress_all(now);
    return;
  }
  auto silent = watch_.silent(now);
  if (silent.empty()) return;
  attribute_store_connections();
  silent = watch_.silent(now);
  if (silent.empty()) return;
  // Each silent worker is reported once: it is no longer watched.
  for (const auto& s : silent) watch_.stop(s.local_rank);
  on_silent_(silent);
}

void WorkerTimeout::arm() {
  timer_.expires_after(watch_.check_interval());
  std::weak_ptr<bool> alive = alive_;
  std::uint64_t generation = generation_;
  timer_.async_wait([this, alive, generation](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !running_ || generation != generation_) return;
    check();
    if (!alive.expired() && running_ && generation == generation_) arm();
  });
}

std::string hang_text(const std::vector<ProgressWatch::Silent>& silent, int base_global_rank,
                      const std::function<pid_t(int)>& pid_of, std::chrono::milliseconds timeout) {
  std::string list;
  for (const auto& s : silent) {
    list += (list.empty() ? "" : "; ") + std::string("rank ") + std::to_string(base_global_rank + s.local_rank) +
            " (local_rank " + std::to_string(s.local_rank) + ", pid " + std::to_string(pid_of(s.local_rank)) +
            ") silent for " + seconds_text(s.silent_for);
  }
  return "worker watchdog: " + list + ": no output on stdout or stderr, no store request and no file-timer " +
         "request within --worker-timeout " + seconds_text(timeout) + "; taking it for hung: sending SIGKILL";
}

}  // namespace muster::launcher
