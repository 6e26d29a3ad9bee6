#include "worker_timeout.hpp"

#include <ifaddrs.h>
#include <netinet/in.h>

namespace muster::launcher {

namespace {

// This machine's interface addresses: a store peer at one of them (or on
// loopback) is a process of this node.
std::vector<boost::asio::ip::address> interface_addresses() {
  std::vector<boost::asio::ip::address> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      out.push_back(boost::asio::ip::address_v4(ntohl(a->sin_addr.s_addr)));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      boost::asio::ip::address_v6::bytes_type b;
      std::copy(std::begin(a->sin6_addr.s6_addr), std::end(a->sin6_addr.s6_addr), b.begin());
      out.push_back(boost::asio::ip::address_v6(b));
    }
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

WorkerTimeout::WorkerTimeout(boost::asio::io_context& io, std::chrono::milliseconds timeout, Workers workers,
                             OnSilent on_silent)
    : io_(io), watch_(timeout), workers_(std::move(workers)), on_silent_(std::move(on_silent)), timer_(io) {}

WorkerTimeout::~WorkerTimeout() {
  *alive_ = false;
  timer_.cancel();
}

void WorkerTimeout::start(int nproc) {
  ++generation_;
  running_ = true;
  store_conns_.clear();
  own_addresses_ = interface_addresses();
  watch_.start(nproc, ProgressWatch::Clock::now());
  arm();
}

void WorkerTimeout::stop() {
  running_ = false;
  ++generation_;
  watch_.clear();
  store_conns_.clear();
  timer_.cancel();
}

std::function<void()> WorkerTimeout::output_of(int local_rank) {
  // The pump may outlive this group, and this object (the agent's member) the pump.
  std::weak_ptr<bool> alive = alive_;
  std::uint64_t generation = generation_ + 1;  // the group about to start
  return [this, alive, generation, local_rank] {
    if (alive.expired() || generation != generation_) return;
    watch_.progress(local_rank, ProgressWatch::Clock::now());
  };
}

bool WorkerTimeout::is_local(const boost::asio::ip::address& a) const {
  auto plain = a;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) plain = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
  if (plain.is_loopback()) return true;
  for (const auto& own : own_addresses_) {
    if (own == plain || own == a) return true;
  }
  return false;
}

void WorkerTimeout::store_request(std::uint64_t conn, const boost::asio::ip::tcp::endpoint& peer, int store_port) {
  if (!running_) return;
  auto it = store_conns_.find(conn);
  if (it == store_conns_.end()) {
    // Once per connection: a peer on another machine is none of ours; a local
    // one is looked up in /proc among the running workers.
    int owner = -1;
    if (store_conns_.size() >= kMaxWatchedStoreConnections) return;
    if (is_local(peer.address())) {
      if (auto o = local_socket_owner(peer.port(), store_port, workers_())) owner = *o;
    }
    it = store_conns_.emplace(conn, owner).first;
  }
  if (it->second >= 0) watch_.progress(it->second, ProgressWatch::Clock::now());
}

void WorkerTimeout::timer_request(pid_t pid) {
  if (!running_) return;
  for (const auto& [local_rank, worker] : workers_()) {
    if (worker == pid) watch_.progress(local_rank, ProgressWatch::Clock::now());
  }
}

void WorkerTimeout::arm() {
  timer_.expires_after(watch_.check_interval());
  std::weak_ptr<bool> alive = alive_;
  std::uint64_t generation = generation_;
  timer_.async_wait([this, alive, generation](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !running_ || generation != generation_) return;
    auto silent = watch_.silent(ProgressWatch::Clock::now());
    // Each silent worker is reported once: it is no longer watched.
    for (const auto& s : silent) watch_.stop(s.local_rank);
    if (!silent.empty()) on_silent_(silent);
    if (running_ && generation == generation_) arm();
  });
}

}  // namespace muster::launcher
