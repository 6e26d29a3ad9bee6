// Pieces the store server, the rendezvous server and the rendezvous client share.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <string>

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
