// A TCPStore-compatible server on one Asio io_context: PyTorch clients of
// torch 2.x and 1.13 (told apart by their first bytes) and muster's own client
// share one key space. A malformed request closes that connection only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <string>

#include "muster/common/status.hpp"
#include "muster/net/session_server.hpp"
#include "muster/store/state.hpp"

namespace muster::store {

class StoreServer {
 public:
  // Listens on host:port; host "" means every address ([::] dual-stack, else
  // 0.0.0.0); port 0 picks a free port.
  static Result<std::unique_ptr<StoreServer>> listen(boost::asio::io_context& io, const std::string& host, int port);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return sessions_.port(); }
  // A server with no port of its own: connections come to it through adopt()
  // (the static backend's node rank 0, whose --master-port the launcher shares
  // between this store and the rendezvous).
  static std::unique_ptr<StoreServer> create(boost::asio::io_context& io);
  // Serves a connection accepted elsewhere, with the bytes already read from it.
  void adopt(boost::asio::ip::tcp::socket socket, std::string already_read);
  // Called once for each read that carried requests, with the connection's
  // id and its peer (the agent's --worker-timeout counts a request from a
  // worker's connection as that worker's progress).
  using RequestObserver = std::function<void(ConnId, const boost::asio::ip::tcp::endpoint& peer)>;
  void observe_requests(RequestObserver fn) { observer_ = std::move(fn); }
  // Called when a connection has gone (its id is not used again by this server).
  void observe_closes(std::function<void(ConnId)> fn) { close_observer_ = std::move(fn); }
  // Forgets every key and closes every connection (a new attempt of the job).
  void reset();
  void close();
  const StoreState& state() const { return state_; }
  std::size_t connections() const { return sessions_.size(); }

 private:
  class Session;
  explicit StoreServer(boost::asio::io_context& io);
  void add_session(boost::asio::ip::tcp::socket socket, std::string already_read);
  void dispatch(std::vector<Reply>& replies, ConnId from);
  void forget(ConnId id);

  StoreState state_;
  net::SessionServer<Session> sessions_;
  RequestObserver observer_;
  std::function<void(ConnId)> close_observer_;
};

}  // namespace muster::store
