// Tells the rendezvous that this node's health check failed (`health`,
// docs/protocol.md), so `musterctl job` shows a node that stays out of the
// job, before its first join as well as after it stepped out. Each report
// goes on a connection of its own that never joins (the member's connection
// may not exist yet, and must not carry a message an older server refuses):
// connect, authenticate, send, read `health_noted`, close; the whole exchange
// bounded by kHealthReportDeadline. One exchange at a time; a report made
// meanwhile replaces the one waiting. A server that refuses the message as
// one before a join or of an unknown type (an older release) is told nothing
// more; that is said once. Any other error, or a report that cannot be
// delivered, drops that report: the node's log and metrics still have it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/client.hpp"
#include "muster/rendezvous/protocol.hpp"

namespace muster::launcher {

constexpr std::chrono::seconds kHealthReportDeadline{10};

class HealthReporter {
 public:
  HealthReporter(boost::asio::io_context& io, std::string host, int port, std::optional<rendezvous::auth::Key> key);
  ~HealthReporter();
  HealthReporter(const HealthReporter&) = delete;
  HealthReporter& operator=(const HealthReporter&) = delete;

  void report(rendezvous::HealthReport r);
  void close();

 private:
  void send(rendezvous::HealthReport r);
  void done();

  boost::asio::io_context& io_;
  std::string host_;
  int port_;
  std::optional<rendezvous::auth::Key> key_;
  std::shared_ptr<rendezvous::RendezvousClient> client_;  // the exchange under way
  std::optional<rendezvous::HealthReport> waiting_;
  boost::asio::steady_timer deadline_;
  uint64_t exchange_ = 0;  // of the exchange under way: a late callback of an earlier one is ignored
  bool unsupported_ = false;
  bool closed_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
