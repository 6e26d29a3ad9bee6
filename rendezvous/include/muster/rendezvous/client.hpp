// The agent's side of the rendezvous protocol, in the agent's event loop:
// connects (retrying with backoff until a deadline; every error names the
// address), sends frames, heartbeats, and hands each message it receives on.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "muster/common/status.hpp"
#include "muster/rendezvous/core.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "muster/rendezvous/tcp_util.hpp"

namespace muster::rendezvous {

class RendezvousClient : public std::enable_shared_from_this<RendezvousClient> {
 public:
  using OnMessage = std::function<void(const nlohmann::json&)>;
  using OnError = std::function<void(const Status&)>;

  RendezvousClient(boost::asio::io_context& io, std::string host, int port, OnMessage on_message, OnError on_error);

  // Calls on_connected once connected; on_error when the deadline passes.
  void connect(Duration deadline, std::function<void()> on_connected);
  void send(const nlohmann::json& message);
  void start_heartbeats(Duration interval, Duration give_up_after = Duration(0));
  void close();
  std::string address() const;

 private:
  void attempt();
  void read_more();
  void flush();
  void heartbeat_loop(Duration interval);

  boost::asio::io_context& io_;
  std::string host_;
  int port_;
  OnMessage on_message_;
  OnError on_error_;
  boost::asio::ip::tcp::socket socket_;
  boost::asio::ip::tcp::resolver resolver_;
  boost::asio::steady_timer retry_timer_;
  boost::asio::steady_timer heartbeat_timer_;
  Clock::time_point deadline_;
  Duration backoff_{100};
  std::string last_error_;
  std::function<void()> on_connected_;
  FrameReader reader_;
  std::array<char, 16384> buf_{};
  net::WriteQueue out_;
  bool closed_ = false;
  bool connected_ = false;
};

}  // namespace muster::rendezvous
