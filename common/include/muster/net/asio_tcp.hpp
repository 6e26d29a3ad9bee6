// Pieces the store server, the rendezvous server and the rendezvous client share.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "muster/common/status.hpp"

namespace muster::net {

using boost::asio::ip::tcp;

// Binds and listens: host "" or "::" means every address ([::] dual-stack,
// else 0.0.0.0); port 0 picks a free one. Returns the port; errors name
// `what` and the address.
Result<int> open_listener(tcp::acceptor& acceptor, const std::string& host, int port, const std::string& what);

// Accepts connections while *alive, handing each (TCP_NODELAY set) to
// on_socket. After an error other than cancellation (out of descriptors, say)
// it waits 100 ms rather than spin.
void accept_forever(tcp::acceptor& acceptor, boost::asio::steady_timer& retry, std::shared_ptr<bool> alive,
                    const std::string& who, std::function<void(tcp::socket)> on_socket);

// One listening socket and its accept loop, for every Asio server of muster: binds
// (open_listener), accepts until close() (accept_forever), and says through
// alive() whether the server is still open, which handlers that wake after
// the server has gone check before they touch it. A server that serves only
// connections handed to it (adopt) never calls listen() and is open until
// close().
class Acceptor {
 public:
  explicit Acceptor(boost::asio::io_context& io) : acceptor_(io), retry_(io) {}
  ~Acceptor() { close(); }
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Binds host:port (`what` names the server in errors) and hands each
  // connection to on_socket until close(); `who` names it in the log.
  Result<int> listen(const std::string& host, int port, const std::string& what, const std::string& who,
                     std::function<void(tcp::socket)> on_socket);
  // Stops accepting; alive() turns false. Idempotent.
  void close();
  bool open() const { return *alive_; }
  const std::shared_ptr<bool>& alive() const { return alive_; }
  int port() const { return port_; }

 private:
  tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  int port_ = 0;
};

// Reads a connection's input with few system calls and little memory per
// connection. Each read waits on a small buffer of the reader's own (Asio's
// reactor then learns from a short read that the socket is drained, and waits
// for the next request without a failed read or an epoll_ctl of its own:
// one recv per small request). A read that fills that buffer goes on into a
// buffer shared by every connection served on this thread, until the socket
// has no more. A connection that waits for input holds kInlineRead bytes,
// where a 64 KiB buffer each would be 6.4 GB at 100,000 connections.
class Reader {
 public:
  static constexpr std::size_t kInlineRead = 512;
  // What the socket held, as a view valid until the caller next suspends or
  // reads again. On end of stream or error: an empty view with `ec` set.
  boost::asio::awaitable<std::string_view> read(tcp::socket& socket, boost::system::error_code& ec);

 private:
  std::array<char, kInlineRead> inline_{};
};

// Bytes queued for one socket, written a batch at a time.
class WriteQueue {
 public:
  void push(std::string_view bytes) { pending_.append(bytes); }
  bool writing() const { return writing_; }
  // Bytes pushed and not yet written.
  std::size_t queued() const { return pending_.size() + (writing_ ? sending_.size() : 0); }
  // Writes what is pending; done(error) once the queue is empty or a write failed.
  // keep_alive holds the queue's owner until the write completes.
  void flush(tcp::socket& socket, std::shared_ptr<void> keep_alive,
             std::function<void(const boost::system::error_code&)> done);

 private:
  std::string pending_;
  std::string sending_;
  bool writing_ = false;
};

}  // namespace muster::net
