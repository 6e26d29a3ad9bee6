#include "muster/store/server.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

#include "muster/common/log.hpp"
#include "muster/rendezvous/tcp_util.hpp"

namespace muster::store {

namespace asio = boost::asio;
using asio::ip::tcp;

class StoreServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(StoreServer& server, ConnId id, tcp::socket socket)
      : server_(server), id_(id), socket_(std::move(socket)), alive_(server.alive_) {}

  void start() {
    asio::co_spawn(socket_.get_executor(), read_loop(shared_from_this()), asio::detached);
  }

  void send(const std::string& bytes) {
    if (closed_) return;
    out_.push(bytes);
    auto self = shared_from_this();
    out_.flush(socket_, self, [self](const boost::system::error_code& ec) {
      if (ec) self->close();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

 private:
  // Decides the dialect from the connection's first bytes; false: need more.
  bool detect() {
    if (dialect_known_) return true;
    if (in_.empty()) return false;
    if (static_cast<uint8_t>(in_[0]) != 0) {
      dialect_ = Dialect::v1_13;
    } else {
      if (in_.size() < 5) return false;
      if (server_.diverter_ && static_cast<uint8_t>(in_[1]) <= 0x10 && in_[4] == '{') {
        diverted_ = true;
        return false;
      }
      uint32_t magic = 0;
      std::memcpy(&magic, in_.data() + 1, 4);
      dialect_ = magic == kValidateMagic ? Dialect::v2 : Dialect::v1_13;
    }
    dialect_known_ = true;
    return true;
  }

  static asio::awaitable<void> read_loop(std::shared_ptr<Session> self) {
    std::array<char, 65536> buf{};
    try {
      while (!self->closed_) {
        std::size_t n = co_await self->socket_.async_read_some(asio::buffer(buf), asio::use_awaitable);
        if (!*self->alive_) co_return;
        if (self->closed_) break;  // reset() meanwhile: nothing of a dead attempt may reach the new store
        self->in_.append(buf.data(), n);
        if (!self->process()) break;
      }
    } catch (const boost::system::system_error&) {
      // The peer went away.
    }
    if (*self->alive_) self->server_.forget(self->id_);
  }

  // Handles every complete request in the buffer; false closes the connection.
  bool process() {
    if (!detect()) {
      if (!diverted_) return true;
      closed_ = true;  // the socket now belongs to the rendezvous
      server_.diverter_(std::move(socket_), std::move(in_));
      return false;
    }
    std::size_t offset = 0;
    std::vector<Reply> replies;
    bool ok = true;
    while (offset < in_.size()) {
      Request req;
      auto parsed = parse_request(dialect_, std::string_view(in_).substr(offset), req);
      if (parsed.status == ParseStatus::incomplete) break;
      if (parsed.status == ParseStatus::invalid) {
        log::warning("store: closing a connection after an invalid request: " + parsed.error);
        ok = false;
        break;
      }
      offset += parsed.consumed;
      std::string error;
      if (!server_.state_.handle(id_, dialect_, req, replies, error)) {
        log::warning("store: closing a connection: " + error);
        ok = false;
        break;
      }
    }
    in_.erase(0, offset);
    server_.dispatch(replies);
    if (!ok) close();
    return ok;
  }

  friend class StoreServer;
  StoreServer& server_;
  ConnId id_;
  tcp::socket socket_;
  std::shared_ptr<bool> alive_;
  std::string in_;
  net::WriteQueue out_;
  bool closed_ = false;
  bool dialect_known_ = false;
  bool diverted_ = false;
  Dialect dialect_ = Dialect::v2;
};

StoreServer::StoreServer(asio::io_context& io)
    : io_(io), acceptor_(io), retry_timer_(io), alive_(std::make_shared<bool>(true)) {}

StoreServer::~StoreServer() { close(); }

Result<std::unique_ptr<StoreServer>> StoreServer::listen(asio::io_context& io, const std::string& host, int port) {
  std::unique_ptr<StoreServer> server(new StoreServer(io));
  auto bound = net::open_listener(server->acceptor_, host, port, "the store");
  if (!bound.ok()) return bound.status();
  server->port_ = bound.value();
  server->accept();
  return server;
}

void StoreServer::accept() {
  net::accept_forever(acceptor_, retry_timer_, alive_, "store", [this](tcp::socket socket) {
    ConnId id = next_id_++;
    auto session = std::make_shared<Session>(*this, id, std::move(socket));
    sessions_[id] = session;
    session->start();
  });
}

void StoreServer::dispatch(std::vector<Reply>& replies) {
  for (auto& r : replies) {
    auto it = sessions_.find(r.conn);
    if (it != sessions_.end()) it->second->send(r.bytes);
  }
  replies.clear();
}

void StoreServer::forget(ConnId id) {
  state_.disconnect(id);
  sessions_.erase(id);
}

void StoreServer::reset() {
  auto sessions = std::move(sessions_);
  sessions_.clear();
  for (auto& [id, s] : sessions) s->close();
  state_.clear();
}

void StoreServer::close() {
  if (!*alive_) return;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  for (auto& [id, s] : sessions_) s->close();
  sessions_.clear();
  state_.clear();
  *alive_ = false;
}

}  // namespace muster::store
