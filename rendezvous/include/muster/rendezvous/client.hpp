// The agent's side of the rendezvous protocol, in the agent's event loop:
// connects (retrying with backoff until a deadline, saying at most every few
// seconds why it cannot yet; every error names the address), sends frames and
// hands each message it receives on. A broken connection is reported with
// on_lost, and the owner decides whether to reconnect(); each connection is
// its own object, so nothing of an old one (queued bytes, a late error) leaks
// into the next.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "muster/common/status.hpp"
#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/core.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "muster/net/asio_tcp.hpp"

namespace muster::rendezvous {

class RendezvousClient : public std::enable_shared_from_this<RendezvousClient> {
 public:
  using OnMessage = std::function<void(const nlohmann::json&)>;
  using OnStatus = std::function<void(const Status&)>;

  // on_error: the rendezvous cannot be used (a deadline passed, a bad frame).
  // on_lost: the connection broke; reconnect() or give up.
  RendezvousClient(boost::asio::io_context& io, std::string host, int port, OnMessage on_message, OnStatus on_error,
                   OnStatus on_lost);

  // Calls on_connected once connected; on_error when the deadline passes.
  void connect(Duration deadline, std::function<void()> on_connected);
  // Drops the current connection (if any) and connects again, as connect().
  void reconnect(Duration deadline, std::function<void()> on_connected);
  // Queued while connecting; dropped with a connection that breaks.
  void send(const nlohmann::json& message);
  bool connected() const;
  // The kernel fails a connection whose sent bytes go unacknowledged this long.
  void set_user_timeout(Duration timeout) { user_timeout_ = timeout; }
  // Every connection proves it holds `key` and authenticates each frame
  // (auth.hpp); a connection counts as connected once the server has proved
  // it holds the same key. Set before connect().
  void set_auth_key(auth::Key key) { key_.emplace(std::move(key)); }
  void close();
  std::string address() const;

  // Longest wait between connection attempts.
  static constexpr Duration kMaxBackoff{1000};
  // Longest one attempt may take (a SYN to a host that is gone).
  static constexpr Duration kAttemptTimeout{5000};
  // How often a failing connect says so.
  static constexpr Duration kRetryNoticeEvery{5000};

 private:
  struct Connection;
  void attempt();
  void retry(const std::string& why);
  void read_more(std::shared_ptr<Connection> c);
  void opened(const std::shared_ptr<Connection>& c);
  // A message received while waiting for the server's challenge.
  bool on_handshake(const std::shared_ptr<Connection>& c, const nlohmann::json& msg);
  void flush(std::shared_ptr<Connection> c);
  void lost(const std::shared_ptr<Connection>& c, const Status& why);

  boost::asio::io_context& io_;
  std::string host_;
  int port_;
  OnMessage on_message_;
  OnStatus on_error_;
  OnStatus on_lost_;
  boost::asio::ip::tcp::resolver resolver_;
  boost::asio::steady_timer retry_timer_;
  boost::asio::steady_timer attempt_timer_;
  std::shared_ptr<Connection> conn_;
  Clock::time_point deadline_;
  Duration backoff_{100};
  Duration user_timeout_{0};
  std::optional<auth::Key> key_;
  std::string last_error_;
  Clock::time_point last_notice_{};
  int attempts_ = 0;
  std::function<void()> on_connected_;
  bool closed_ = false;
};

}  // namespace muster::rendezvous
