#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "muster/common/endpoint.hpp"
#include "muster/common/log.hpp"
#include "muster/metrics/http.hpp"
#include "muster/net/asio_tcp.hpp"

namespace muster::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

Text& Text::family(const std::string& name, const std::string& type, const std::string& help) {
  name_ = name;
  out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  return *this;
}

Text& Text::sample(const std::vector<std::pair<std::string, std::string>>& labels, double value) {
  out_ += name_;
  if (!labels.empty()) {
    out_ += "{";
    for (std::size_t i = 0; i < labels.size(); ++i) {
      out_ += (i ? "," : "") + labels[i].first + "=\"" + escape_label(labels[i].second) + "\"";
    }
    out_ += "}";
  }
  out_ += " " + number(value) + "\n";
  return *this;
}

struct HttpServer::State : std::enable_shared_from_this<State> {
  State(asio::io_context& io, Render r) : io(io), acceptor(io), render(std::move(r)) {}
  asio::io_context& io;
  net::Acceptor acceptor;
  const std::shared_ptr<bool> alive = acceptor.alive();
  Render render;
  std::set<std::shared_ptr<beast::tcp_stream>> open;
  // Connections by peer: an IPv4 address, or an IPv6 /64 (what one host is
  // handed), with v4-mapped addresses counted as the IPv4 address they are.
  std::map<asio::ip::address, std::size_t> per_peer;

  static asio::ip::address peer_key(const asio::ip::address& a) {
    if (!a.is_v6()) return a;
    auto v6 = a.to_v6();
    if (v6.is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, v6);
    auto bytes = v6.to_bytes();
    for (std::size_t i = 8; i < bytes.size(); ++i) bytes[i] = 0;
    return asio::ip::address_v6(bytes);
  }
  std::string rendered;
  std::optional<std::chrono::steady_clock::time_point> rendered_at;  // none yet

  const std::string& text() {
    auto now = std::chrono::steady_clock::now();
    if (!rendered_at || now - *rendered_at >= kRenderReuse) {
      rendered = render();
      rendered_at = now;
    }
    return rendered;
  }

  void serve(tcp::socket socket) {
    boost::system::error_code ec;
    auto endpoint = socket.remote_endpoint(ec);
    auto peer = ec ? asio::ip::address() : peer_key(endpoint.address());
    auto held = per_peer.find(peer);
    if (ec || open.size() >= kMaxConnections || (held != per_peer.end() && held->second >= kMaxConnectionsPerPeer)) {
      boost::system::error_code ignored;
      socket.close(ignored);
      return;
    }
    ++per_peer[peer];
    auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
    open.insert(stream);
    asio::co_spawn(io, session(shared_from_this(), stream, peer), asio::detached);
  }

  void forget(const std::shared_ptr<beast::tcp_stream>& stream, const asio::ip::address& peer) {
    open.erase(stream);
    if (auto it = per_peer.find(peer); it != per_peer.end() && --it->second == 0) per_peer.erase(it);
  }

  static asio::awaitable<void> session(std::shared_ptr<State> self, std::shared_ptr<beast::tcp_stream> stream,
                                       asio::ip::address peer) {
    try {
      beast::flat_buffer buffer(kMaxRequestBytes);
      for (;;) {
        http::request_parser<http::empty_body> parser;
        parser.header_limit(kMaxRequestBytes);
        parser.body_limit(0);
        stream->expires_after(kIoTimeout);
        boost::system::error_code ec;
        co_await http::async_read(*stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
        if (!*self->alive) co_return;
        http::response<http::string_body> res;
        bool keep = false;
        if (ec == http::error::end_of_stream || ec == asio::error::eof) break;
        if (ec) {
          if (ec == beast::error::timeout || ec == asio::error::operation_aborted) break;
          res.result(http::status::bad_request);
          res.body() = "bad request: " + ec.message() + "\n";
        } else {
          const auto& req = parser.get();
          res.version(req.version());
          keep = req.keep_alive();
          std::string target(req.target());
          if (req.method() != http::verb::get && req.method() != http::verb::head) {
            res.result(http::status::method_not_allowed);
            res.set(http::field::allow, "GET, HEAD");
            res.body() = "only GET\n";
          } else if (target == "/metrics" || target.rfind("/metrics?", 0) == 0) {
            res.result(http::status::ok);
            res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
            res.body() = self->text();
            if (req.method() == http::verb::head) {
              res.content_length(res.body().size());
              res.body().clear();
            }
          } else {
            res.result(http::status::not_found);
            res.body() = "muster serves its metrics at /metrics\n";
          }
        }
        res.set(http::field::server, "muster");
        if (res.find(http::field::content_length) == res.end()) res.prepare_payload();
        res.keep_alive(keep);
        stream->expires_after(kIoTimeout);
        co_await http::async_write(*stream, res, asio::redirect_error(asio::use_awaitable, ec));
        if (ec || !keep || !*self->alive) break;
      }
    } catch (const std::exception& e) {
      log::warning(std::string("metrics: a scrape failed: ") + e.what());
    }
    boost::system::error_code ignored;
    stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream->close();
    if (*self->alive) self->forget(stream, peer);
  }
};

HttpServer::HttpServer(asio::io_context& io, Render render) : state_(std::make_shared<State>(io, std::move(render))) {}

HttpServer::~HttpServer() { close(); }

Result<std::unique_ptr<HttpServer>> HttpServer::listen(asio::io_context& io, const std::string& host, int port,
                                                       Render render) {
  std::unique_ptr<HttpServer> server(new HttpServer(io, std::move(render)));
  std::weak_ptr<State> weak = server->state_;
  auto bound = server->state_->acceptor.listen(host, port, "the metrics endpoint", "metrics", [weak](tcp::socket socket) {
    if (auto s = weak.lock()) s->serve(std::move(socket));
  });
  if (!bound.ok()) return bound.status();
  server->port_ = bound.value();
  server->host_ = host;
  return server;
}

Result<std::unique_ptr<HttpServer>> HttpServer::listen_at(asio::io_context& io, const std::string& option,
                                                          const std::string& endpoint, int default_port,
                                                          Render render) {
  auto ep = parse_endpoint(endpoint, default_port);
  if (!ep.ok()) return Status(Code::invalid_argument, option + ": " + ep.status().message());
  // (parse_endpoint gives an IPv6 host without its brackets.)
  std::string host = ep->host == "localhost" ? "127.0.0.1" : ep->host;
  auto server = listen(io, host, ep->port, std::move(render));
  if (!server.ok()) return Status(server.status().code(), option + ": " + server.status().message());
  return server;
}

std::string HttpServer::endpoint() const {
  return Endpoint{host_.empty() ? std::string("0.0.0.0") : host_, port_}.to_string();
}

void HttpServer::close() {
  if (!state_ || !state_->acceptor.open()) return;
  state_->acceptor.close();
  for (const auto& s : state_->open) s->close();
  state_->open.clear();
  state_->per_peer.clear();
}

}  // namespace muster::metrics
