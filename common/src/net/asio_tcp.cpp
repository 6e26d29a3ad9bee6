#include "muster/net/asio_tcp.hpp"

#include <array>
#include <cstring>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "muster/common/log.hpp"

namespace muster::net {

namespace asio = boost::asio;

Result<int> open_listener(tcp::acceptor& acceptor, const std::string& host, int port, const std::string& what) {
  boost::system::error_code ec;
  auto try_bind = [&](const tcp::endpoint& ep, bool dual_stack) {
    ec.clear();
    acceptor.close(ec);
    ec.clear();
    acceptor.open(ep.protocol(), ec);
    if (ec) return false;
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (dual_stack) acceptor.set_option(asio::ip::v6_only(false), ec);
    ec.clear();
    acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    return !ec;
  };
  auto p = static_cast<uint16_t>(port);
  bool bound = false;
  std::string where;
  if (host.empty() || host == "::") {
    bound = try_bind(tcp::endpoint(asio::ip::address_v6::any(), p), true) ||
            try_bind(tcp::endpoint(asio::ip::address_v4::any(), p), false);
    where = "[::]:" + std::to_string(port);
  } else {
    auto addr = asio::ip::make_address(host, ec);
    if (ec) return invalid_argument(what + ": the listen address '" + host + "' is not an IP address");
    bound = try_bind(tcp::endpoint(addr, p), false);
    where = (addr.is_v6() ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
  if (!bound) return Status(Code::unavailable, what + " cannot listen on " + where + ": " + ec.message());
  return static_cast<int>(acceptor.local_endpoint().port());
}

void accept_forever(tcp::acceptor& acceptor, asio::steady_timer& retry, std::shared_ptr<bool> alive,
                    const std::string& who, std::function<void(tcp::socket)> on_socket) {
  acceptor.async_accept([&acceptor, &retry, alive, who, on_socket](const boost::system::error_code& ec,
                                                                   tcp::socket socket) {
    if (!*alive) return;
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      log::warning(who + ": accept failed: " + ec.message() + "; retrying in 100 ms");
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([&acceptor, &retry, alive, who, on_socket](const boost::system::error_code& e) {
        if (!e && *alive) accept_forever(acceptor, retry, alive, who, on_socket);
      });
      return;
    }
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    on_socket(std::move(socket));
    accept_forever(acceptor, retry, alive, who, on_socket);
  });
}

Result<int> Acceptor::listen(const std::string& host, int port, const std::string& what, const std::string& who,
                            std::function<void(tcp::socket)> on_socket) {
  auto bound = open_listener(acceptor_, host, port, what);
  if (!bound.ok()) return bound.status();
  port_ = bound.value();
  accept_forever(acceptor_, retry_, alive_, who, std::move(on_socket));
  return port_;
}

void Acceptor::close() {
  if (!*alive_) return;
  *alive_ = false;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_.cancel();
}

namespace {
// One read takes at most this much; the rest stays in the kernel for the next.
constexpr std::size_t kReadChunk = 64 * 1024;
// A queue that once held a large reply gives its memory back after writing it.
constexpr std::size_t kKeepWriteCapacity = 64 * 1024;
}  // namespace

asio::awaitable<std::string_view> Reader::read(tcp::socket& socket, boost::system::error_code& ec) {
  thread_local std::array<char, kReadChunk> scratch;
  ec.clear();
  std::size_t n = co_await socket.async_read_some(asio::buffer(inline_), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return std::string_view();
  if (n < inline_.size()) co_return std::string_view(inline_.data(), n);
  // The buffer filled: take the rest of what the socket holds without waiting.
  std::memcpy(scratch.data(), inline_.data(), n);
  boost::system::error_code more;
  if (!socket.non_blocking()) socket.non_blocking(true, more);
  while (!more && n < scratch.size()) {
    std::size_t want = scratch.size() - n;
    std::size_t got = socket.read_some(asio::buffer(scratch.data() + n, want), more);
    n += got;
    if (got < want) break;  // drained
  }
  // A failure here (would-block included) is left for the next read to meet
  // on its own: these bytes are good.
  co_return std::string_view(scratch.data(), n);
}

void WriteQueue::flush(tcp::socket& socket, std::shared_ptr<void> keep_alive,
                       std::function<void(const boost::system::error_code&)> done) {
  if (writing_ || pending_.empty()) return;
  writing_ = true;
  sending_.swap(pending_);
  pending_.clear();
  asio::async_write(socket, asio::buffer(sending_),
                    [this, &socket, keep_alive, done](const boost::system::error_code& ec, std::size_t) {
                      writing_ = false;
                      if (sending_.capacity() > kKeepWriteCapacity) std::string().swap(sending_);
                      if (ec || pending_.empty()) return done(ec);
                      flush(socket, keep_alive, done);
                    });
}

}  // namespace muster::net
