// A Prometheus endpoint: GET /metrics on its own port, in the owner's event
// loop, answered with the text the owner renders at that moment (Boost.Beast).
// A scrape is bounded like any peer: requests of at most kMaxRequestBytes, a
// deadline on every read and write, at most kMaxConnections at once; a bad
// request gets 400 and the connection closes, nothing else is disturbed.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::metrics {

constexpr std::size_t kMaxRequestBytes = 8 * 1024;
constexpr std::size_t kMaxConnections = 64;
// One peer (an IPv4 address, an IPv6 /64) cannot hold every slot. A peer that
// keeps its connections busy can still hold its share: bind the endpoint where
// only the monitoring system reaches it.
constexpr std::size_t kMaxConnectionsPerPeer = 8;
// Scrapes within this long of a render get the same text (pipelined or
// concurrent scrapes cost one walk of the owner's state).
constexpr std::chrono::milliseconds kRenderReuse{250};
constexpr std::chrono::seconds kIoTimeout{10};

// The Prometheus text exposition format (version 0.0.4), one family at a time.
class Text {
 public:
  // Starts a family: its HELP and TYPE lines ("gauge" or "counter").
  Text& family(const std::string& name, const std::string& type, const std::string& help);
  // A sample of the current family: labels as name/value pairs.
  Text& sample(const std::vector<std::pair<std::string, std::string>>& labels, double value);
  Text& sample(double value) { return sample({}, value); }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
  std::string name_;
};

class HttpServer {
 public:
  using Render = std::function<std::string()>;
  // host "" listens on every interface; port 0 picks one.
  static Result<std::unique_ptr<HttpServer>> listen(boost::asio::io_context& io, const std::string& host, int port,
                                                    Render render);
  // The same from ADDR:PORT as an operator writes it (a --metrics-listen
  // value): "localhost" is 127.0.0.1, an IPv6 address may be in brackets, a
  // missing port is default_port. Errors name the option.
  static Result<std::unique_ptr<HttpServer>> listen_at(boost::asio::io_context& io, const std::string& option,
                                                       const std::string& endpoint, int default_port, Render render);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  int port() const { return port_; }
  // host:port as bound (brackets around IPv6).
  std::string endpoint() const;
  void close();

 private:
  HttpServer(boost::asio::io_context& io, Render render);
  struct State;
  std::shared_ptr<State> state_;
  int port_ = 0;
  std::string host_;
};

}  // namespace muster::metrics
