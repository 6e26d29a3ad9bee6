// The skeleton the store server and the rendezvous server share: an Acceptor
// (or none: connections handed over with adopt()), the sessions being
// served, by id, and one close() that ends them all. What a session does
// with its connection is the server's own; the skeleton asks of a Session
// only close(), which must not call back into the server (a session's read
// loop, woken by the close, checks alive() and leaves the server alone once
// it is false).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "muster/net/asio_tcp.hpp"

namespace muster::net {

template <typename Session>
class SessionServer {
 public:
  using Id = std::uint64_t;
  // A new connection: accepted here, or adopted with the bytes already read from it.
  using OnConnection = std::function<void(tcp::socket, std::string already_read)>;

  SessionServer(boost::asio::io_context& io, OnConnection on_connection)
      : acceptor_(io), on_connection_(std::move(on_connection)) {}
  ~SessionServer() { close(); }
  SessionServer(const SessionServer&) = delete;
  SessionServer& operator=(const SessionServer&) = delete;

  Result<int> listen(const std::string& host, int port, const std::string& what, const std::string& who) {
    return acceptor_.listen(host, port, what, who,
                            [this](tcp::socket socket) { on_connection_(std::move(socket), std::string()); });
  }
  // Serves a connection accepted elsewhere (a port shared with another server).
  void adopt(tcp::socket socket, std::string already_read) {
    if (open()) on_connection_(std::move(socket), std::move(already_read));
  }

  Id next_id() { return next_id_++; }
  void add(Id id, std::shared_ptr<Session> session) { sessions_[id] = std::move(session); }
  Session* find(Id id) const {
    auto it = sessions_.find(id);
    return it == sessions_.end() ? nullptr : it->second.get();
  }
  void erase(Id id) { sessions_.erase(id); }
  std::size_t size() const { return sessions_.size(); }

  // Closes every session; the server goes on accepting.
  void close_sessions() {
    auto sessions = std::move(sessions_);
    sessions_.clear();
    for (auto& [id, s] : sessions) s->close();
  }
  // Stops accepting and closes every session. Idempotent.
  void close() {
    if (!open()) return;
    acceptor_.close();
    close_sessions();
  }
  bool open() const { return acceptor_.open(); }
  // Held by sessions and handlers: false once the server is closed.
  const std::shared_ptr<bool>& alive() const { return acceptor_.alive(); }
  int port() const { return acceptor_.port(); }

 private:
  Acceptor acceptor_;
  OnConnection on_connection_;
  Id next_id_ = 1;
  std::unordered_map<Id, std::shared_ptr<Session>> sessions_;
};

}  // namespace muster::net
