#include "muster/store/server.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <optional>

#include "muster/common/log.hpp"
#include "muster/net/asio_tcp.hpp"

namespace muster::store {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
// A connection whose unsent replies pass this stops being read until they
// drain (the client blocks on its own send, as with a slow server).
constexpr std::size_t kPauseReadingAt = 4 * 1024 * 1024;
// Bytes that other connections' actions queue for one that never reads
// (WAIT completions, 1.13 watch notifications); past it, it is closed.
constexpr std::size_t kMaxQueuedForOthers = 64 * 1024 * 1024;
// Consumed input is dropped from the buffer once this much has piled up.
constexpr std::size_t kCompactAt = 1024 * 1024;
}  // namespace

class StoreServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(StoreServer& server, ConnId id, tcp::socket socket, std::string already_read)
      : server_(server), id_(id), socket_(std::move(socket)), resume_(socket_.get_executor()),
        alive_(server.sessions_.alive()), in_(std::move(already_read)) {}

  void start() {
    asio::co_spawn(socket_.get_executor(), read_loop(shared_from_this()), asio::detached);
  }

  void send(const std::string& bytes) {
    if (closed_) return;
    out_.push(bytes);
    auto self = shared_from_this();
    out_.flush(socket_, self, [self](const boost::system::error_code& ec) {
      if (ec) return self->close();
      self->resume_.cancel();  // drained: reading may go on
    });
  }

  std::size_t queued() const { return out_.queued(); }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    resume_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

 private:
  // Decides the dialect from the connection's first bytes; false: need more.
  bool detect() {
    if (parser_) return true;
    std::string_view in = std::string_view(in_).substr(in_pos_);
    if (in.empty()) return false;
    Dialect dialect = Dialect::with_validate;
    if (static_cast<uint8_t>(in[0]) != 0) {
      dialect = Dialect::before_validate;
    } else {
      if (in.size() < 5) return false;
      uint32_t magic = 0;
      std::memcpy(&magic, in.data() + 1, 4);
      dialect = magic == kValidateMagic ? Dialect::with_validate : Dialect::before_validate;
    }
    dialect_ = dialect;
    parser_.emplace(dialect);
    return true;
  }

  static asio::awaitable<void> read_loop(std::shared_ptr<Session> self) {
    boost::system::error_code ec;
    // Bytes read before the session began (an adopted connection's) come first.
    if (!self->in_.empty() && !self->process()) self->close();
    while (!self->closed_) {
      // Back-pressure: a client that does not read its replies is not read either.
      while (!self->closed_ && self->out_.queued() > kPauseReadingAt) {
        self->resume_.expires_at(asio::steady_timer::time_point::max());
        co_await self->resume_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        if (!*self->alive_) co_return;
      }
      if (self->closed_) break;
      if (!self->held_back_) {
        auto bytes = co_await self->input_.read(self->socket_, ec);
        if (!*self->alive_) co_return;
        if (ec || self->closed_) break;  // the peer went away, or reset() meanwhile
        try {
          self->in_.append(bytes);
        } catch (const std::exception& e) {
          log::warning(std::string("store: closing a connection: ") + e.what());
          self->close();
          break;
        }
      }
      bool keep = self->process();
      if (!keep) {
        self->close();
        break;
      }
    }
    if (*self->alive_) self->server_.forget(self->id_);
  }

  // Handles every complete request in the buffer; false closes the connection.
  bool process() {
    if (!detect()) return true;
    std::vector<Reply> replies;
    bool ok = true;
    bool any = false;
    held_back_ = false;
    std::size_t own_bytes = out_.queued();
    std::size_t counted = 0;
    while (in_pos_ < in_.size()) {
      for (; counted < replies.size(); ++counted) {
        if (replies[counted].conn == id_) own_bytes += replies[counted].bytes.size();
      }
      if (own_bytes > kPauseReadingAt) {
        held_back_ = true;  // the rest waits until this client has read its replies
        break;
      }
      Request req;
      auto parsed = parser_->next(std::string_view(in_).substr(in_pos_), req);
      in_pos_ += parsed.consumed;
      if (parsed.status == ParseStatus::incomplete) break;
      if (parsed.status == ParseStatus::invalid) {
        log::warning("store: closing a connection after an invalid request: " + parsed.error.substr(0, 300));
        ok = false;
        break;
      }
      std::string error;
      bool handled = false;
      any = true;
      try {
        handled = server_.state_.handle(id_, req, replies, error);
      } catch (const std::exception& e) {
        // Nothing in the state should throw but memory running out; the
        // replies gathered so far still go out (they may wake other clients).
        error = std::string("the request could not be handled: ") + e.what();
      }
      if (!handled) {
        log::warning("store: closing a connection: " + error.substr(0, 300));
        ok = false;
        break;
      }
    }
    if (in_pos_ == in_.size()) {
      // A connection that once sent a large value does not keep its memory.
      if (in_.capacity() > kCompactAt) std::string().swap(in_);
      else in_.clear();
      in_pos_ = 0;
    } else if (in_pos_ >= kCompactAt) {
      in_.erase(0, in_pos_);
      in_pos_ = 0;
    }
    server_.dispatch(replies, id_);
    if (any && server_.observer_) {
      if (!peer_) {  // asked once per connection
        boost::system::error_code ec;
        auto peer = socket_.remote_endpoint(ec);
        if (!ec) peer_ = peer;
      }
      if (peer_) server_.observer_(id_, *peer_);
    }
    return ok;
  }

  friend class StoreServer;
  StoreServer& server_;
  ConnId id_;
  tcp::socket socket_;
  net::Reader input_;
  asio::steady_timer resume_;
  std::shared_ptr<bool> alive_;
  std::string in_;
  std::size_t in_pos_ = 0;
  std::optional<RequestParser> parser_;
  std::optional<tcp::endpoint> peer_;
  net::WriteQueue out_;
  bool closed_ = false;
  bool held_back_ = false;  // requests left in in_ for want of room to answer them
  Dialect dialect_ = Dialect::with_validate;
};

StoreServer::StoreServer(asio::io_context& io)
    : sessions_(io, [this](tcp::socket socket, std::string already_read) {
        add_session(std::move(socket), std::move(already_read));
      }) {}

StoreServer::~StoreServer() { close(); }

Result<std::unique_ptr<StoreServer>> StoreServer::listen(asio::io_context& io, const std::string& host, int port) {
  std::unique_ptr<StoreServer> server(new StoreServer(io));
  auto bound = server->sessions_.listen(host, port, "the store", "store");
  if (!bound.ok()) return bound.status();
  return server;
}

std::unique_ptr<StoreServer> StoreServer::create(asio::io_context& io) {
  return std::unique_ptr<StoreServer>(new StoreServer(io));
}

void StoreServer::adopt(tcp::socket socket, std::string already_read) {
  sessions_.adopt(std::move(socket), std::move(already_read));
}

void StoreServer::add_session(tcp::socket socket, std::string already_read) {
  ConnId id = sessions_.next_id();
  auto session = std::make_shared<Session>(*this, id, std::move(socket), std::move(already_read));
  sessions_.add(id, session);
  session->start();
}

void StoreServer::dispatch(std::vector<Reply>& replies, ConnId from) {
  for (auto& r : replies) {
    Session* session = sessions_.find(r.conn);
    if (!session) continue;
    if (r.conn != from && session->queued() > kMaxQueuedForOthers) {
      log::warning("store: closing a connection that has not read " + std::to_string(session->queued()) +
                   " bytes of notifications");
      session->close();
      continue;
    }
    session->send(r.bytes);
  }
  replies.clear();
}

void StoreServer::forget(ConnId id) {
  state_.disconnect(id);
  sessions_.erase(id);
  if (close_observer_) close_observer_(id);
}

void StoreServer::reset() {
  sessions_.close_sessions();
  state_.clear();
}

void StoreServer::close() {
  if (!sessions_.open()) return;
  sessions_.close();
  state_.clear();
}

}  // namespace muster::store
