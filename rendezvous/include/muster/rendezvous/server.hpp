// The rendezvous server: many jobs keyed by rdzv_id on one Asio io_context,
// each a Rendezvous core with its own timer. musterd runs it; an agent that
// hosts its job's rendezvous runs the same code. A bad frame, malformed JSON,
// an unknown type or a message out of order gets an error reply and closes
// that connection only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <memory>
#include <string>

#include "muster/common/status.hpp"
#include "muster/rendezvous/core.hpp"

namespace muster::rendezvous {

class RendezvousServer {
 public:
  static Result<std::unique_ptr<RendezvousServer>> listen(boost::asio::io_context& io, const std::string& host,
                                                          int port);
  // A server without a listener of its own: it serves connections handed to
  // it with adopt() (the static backend, sharing the store's port).
  static std::unique_ptr<RendezvousServer> create(boost::asio::io_context& io);
  void adopt(boost::asio::ip::tcp::socket socket, std::string already_read);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const { return port_; }
  std::size_t jobs() const { return jobs_.size(); }
  void close();

 private:
  class Session;
  struct Job;
  explicit RendezvousServer(boost::asio::io_context& io);
  void accept();
  void handle(Session& s, const std::string& payload);
  void deliver(Job& job, const std::vector<Output>& outputs);
  void rearm(Job& job, bool full = false);
  void arm(Job& job, TimePoint at);
  void gone(Session& s);

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_timer_;
  int port_ = 0;
  MemberId next_member_ = 1;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::map<MemberId, std::shared_ptr<Session>> sessions_;
  std::shared_ptr<bool> alive_;
};

}  // namespace muster::rendezvous
