#include "muster/rendezvous/client.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>

#include "muster/common/log.hpp"
#include "muster/common/text.hpp"
#include "muster/rendezvous/handshake.hpp"

namespace muster::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

struct RendezvousClient::Connection {
  explicit Connection(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  FrameReader reader;
  net::WriteQueue out;
  std::array<char, 16384> buf{};
  // With a key: this connection's nonce once its hello is sent, the
  // messages sent before the server proved itself, then the channel.
  std::optional<ClientHandshake> handshake;
  std::vector<std::string> held;
  std::optional<auth::Channel> channel;
  bool heard_tagged = false;  // a frame with a good tag has arrived
  bool open = false;  // connected (and authenticated) and not yet broken
  bool done = false;  // broken or dropped: its handlers do nothing more
};

RendezvousClient::RendezvousClient(asio::io_context& io, std::string host, int port, OnMessage on_message,
                                   OnStatus on_error, OnStatus on_lost)
    : io_(io),
      host_(std::move(host)),
      port_(port),
      on_message_(std::move(on_message)),
      on_error_(std::move(on_error)),
      on_lost_(std::move(on_lost)),
      resolver_(io),
      retry_timer_(io),
      attempt_timer_(io) {}

std::string RendezvousClient::address() const {
  return (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

bool RendezvousClient::connected() const { return conn_ && conn_->open; }

void RendezvousClient::connect(Duration deadline, std::function<void()> on_connected) {
  deadline_ = saturating_add(Clock::now(), deadline);
  on_connected_ = std::move(on_connected);
  backoff_ = Duration(100);
  attempts_ = 0;
  last_notice_ = {};
  conn_ = std::make_shared<Connection>(io_);
  attempt();
}

void RendezvousClient::reconnect(Duration deadline, std::function<void()> on_connected) {
  if (closed_) return;
  if (conn_) {
    conn_->done = true;
    conn_->open = false;
    boost::system::error_code ignored;
    conn_->socket.close(ignored);
  }
  retry_timer_.cancel();
  attempt_timer_.cancel();
  resolver_.cancel();
  connect(deadline, std::move(on_connected));
}

void RendezvousClient::retry(const std::string& why) {
  last_error_ = why;
  auto now = Clock::now();
  if (now + backoff_ >= deadline_) {
    on_error_(Status(Code::unavailable, "cannot reach the rendezvous at " + address() + ": " + last_error_ +
                                            "; check --rdzv-endpoint and that its host is up"));
    return;
  }
  // Say why the wait goes on: at the first failure, then every few seconds.
  if (attempts_ == 1 || now - last_notice_ >= kRetryNoticeEvery) {
    last_notice_ = now;
    auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline_ - now).count();
    log::warning("cannot reach the rendezvous at " + address() + " yet (" + why + "); retrying for up to " +
                 std::to_string(left) + " s more");
  }
  retry_timer_.expires_after(backoff_);
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  auto self = shared_from_this();
  retry_timer_.async_wait([self](const boost::system::error_code& e) {
    if (!e && !self->closed_) self->attempt();
  });
}

void RendezvousClient::attempt() {
  auto self = shared_from_this();
  auto c = conn_;
  ++attempts_;
  resolver_.async_resolve(host_, std::to_string(port_), [self, c](const boost::system::error_code& ec,
                                                                  tcp::resolver::results_type results) {
    if (self->closed_ || c->done) return;
    if (ec) return self->retry("the name " + self->host_ + " does not resolve: " + ec.message());
    // One attempt may not hang on a host that does not answer.
    self->attempt_timer_.expires_after(std::min(kAttemptTimeout, std::max(Duration(1), std::chrono::duration_cast<Duration>(self->deadline_ - Clock::now()))));
    self->attempt_timer_.async_wait([c](const boost::system::error_code& e) {
      if (e || c->done || c->open) return;
      boost::system::error_code ignored;
      c->socket.close(ignored);
    });
    asio::async_connect(c->socket, results, [self, c](const boost::system::error_code& e, const tcp::endpoint&) {
      if (self->closed_ || c->done) return;
      self->attempt_timer_.cancel();
      if (e) {
        boost::system::error_code ignored;
        c->socket.close(ignored);
        return self->retry(e == asio::error::operation_aborted ? std::string("no answer") : e.message());
      }
      boost::system::error_code ignored;
      c->socket.set_option(tcp::no_delay(true), ignored);
      if (self->user_timeout_.count() > 0) {
        unsigned int ms = static_cast<unsigned int>(self->user_timeout_.count());
        ::setsockopt(c->socket.native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
      }
      if (!self->key_) return self->opened(c);
      auto nonce = auth::random_bytes(auth::kNonceBytes);
      if (!nonce.ok()) {
        c->done = true;
        return self->on_error_(nonce.status());
      }
      c->handshake.emplace(*self->key_, nonce.value());
      c->out.push(encode_frame(c->handshake->hello()));
      // The server's challenge is awaited as long as a connect would be.
      self->attempt_timer_.expires_after(std::min(kAttemptTimeout, std::max(Duration(1), std::chrono::duration_cast<Duration>(self->deadline_ - Clock::now()))));
      self->attempt_timer_.async_wait([self, c](const boost::system::error_code& e) {
        if (e || c->done || c->open || self->closed_) return;
        // Start over on a fresh connection, keeping what was to be sent.
        c->done = true;
        boost::system::error_code ignored;
        c->socket.close(ignored);
        auto next = std::make_shared<Connection>(self->io_);
        next->held = std::move(c->held);
        if (c == self->conn_) self->conn_ = next;
        self->retry("no answer to the authentication hello");
      });
      self->read_more(c);
      self->flush(c);
    });
  });
}

// Connected (and authenticated, with a key): what was queued goes out.
void RendezvousClient::opened(const std::shared_ptr<Connection>& c) {
  c->open = true;
  if (c->channel) {
    for (const auto& text : c->held) c->out.push(frame_of(c->channel->seal(text)));
    c->held.clear();
  }
  if (c->handshake) attempt_timer_.cancel();
  else read_more(c);
  flush(c);
  if (on_connected_) on_connected_();
}

bool RendezvousClient::on_handshake(const std::shared_ptr<Connection>& c, const nlohmann::json& msg) {
  const std::string& type = msg["type"].get_ref<const std::string&>();
  if (type == "error") {
    // The server refused (it has no key, say): the owner reports its words.
    c->done = true;
    boost::system::error_code ignored;
    c->socket.close(ignored);
    on_message_(msg);
    return false;
  }
  auto fail = [&](const std::string& why) {
    c->done = true;
    boost::system::error_code ignored;
    c->socket.close(ignored);
    on_error_(Status(Code::auth_failed, "the rendezvous at " + address() + " " + why));
    return false;
  };
  auto opened_channel = c->handshake->on_challenge(msg);
  if (!opened_channel.ok()) return fail(opened_channel.status().message());
  c->out.push(encode_frame(opened_channel->auth));
  c->channel.emplace(std::move(opened_channel->session_key), auth::Channel::Side::client);
  opened(c);
  return true;
}

void RendezvousClient::send(const nlohmann::json& message) {
  if (closed_ || !conn_ || conn_->done) return;
  std::string text = dump_message(message);
  if (key_ && !conn_->channel) {
    conn_->held.push_back(std::move(text));
    return;
  }
  conn_->out.push(frame_of(conn_->channel ? conn_->channel->seal(text) : text));
  if (conn_->open) flush(conn_);
}

void RendezvousClient::flush(std::shared_ptr<Connection> c) {
  auto self = shared_from_this();
  c->out.flush(c->socket, c, [self, c](const boost::system::error_code& ec) {
    if (ec && !self->closed_ && !c->done) {
      self->lost(c, Status(Code::unavailable, "lost the rendezvous at " + self->address() + ": " + ec.message()));
    }
  });
}

void RendezvousClient::lost(const std::shared_ptr<Connection>& c, const Status& why) {
  if (c->done) return;
  c->done = true;
  c->open = false;
  boost::system::error_code ignored;
  c->socket.close(ignored);
  if (c == conn_) on_lost_(why);
}

void RendezvousClient::read_more(std::shared_ptr<Connection> c) {
  auto self = shared_from_this();
  c->socket.async_read_some(asio::buffer(c->buf), [self, c](const boost::system::error_code& ec, std::size_t n) {
    if (self->closed_ || c->done) return;
    if (n > 0) {
      c->reader.feed(std::string_view(c->buf.data(), n));
      while (!self->closed_ && !c->done) {
        auto frame = c->reader.next();
        if (!frame.ok()) {
          c->done = true;
          self->on_error_(Status(Code::io_error, "the rendezvous at " + self->address() + " sent a bad frame: " +
                                                     frame.status().message()));
          return;
        }
        if (!frame.value()) break;
        std::string opened;
        if (c->channel) {
          auto m = c->channel->open(*frame.value());
          if (!m.ok()) {
            // The server refuses the agent's proof before the channel is up
            // on its side: that one error comes untagged, in place of the
            // first tagged frame.
            if (!c->heard_tagged) {
              auto plain = parse_message(*frame.value());
              if (plain.ok() && plain.value()["type"] == "error") {
                c->done = true;
                boost::system::error_code ignored;
                c->socket.close(ignored);
                self->on_message_(plain.value());
                return;
              }
            }
            // Something altered the traffic: as with a reset, the
            // connection is lost and the owner may reconnect.
            return self->lost(c, Status(Code::auth_failed, "the rendezvous at " + self->address() +
                                                               " sent a frame that " + m.status().message()));
          }
          c->heard_tagged = true;
          opened = std::move(m.value());
        }
        auto msg = parse_message(c->channel ? opened : *frame.value());
        if (!msg.ok()) {
          c->done = true;
          self->on_error_(Status(Code::io_error, "the rendezvous at " + self->address() + " sent a bad message: " +
                                                     msg.status().message()));
          return;
        }
        if (self->key_ && !c->channel) {
          if (!self->on_handshake(c, msg.value())) return;
          continue;
        }
        self->on_message_(msg.value());
      }
    }
    if (self->closed_ || c->done) return;
    if (ec) {
      return self->lost(c, Status(Code::unavailable, "lost the rendezvous at " + self->address() + ": " +
                                                         (ec == asio::error::eof ? "the server closed the connection"
                                                                                 : ec.message())));
    }
    self->read_more(c);
  });
}

void RendezvousClient::close() {
  if (closed_) return;
  closed_ = true;
  retry_timer_.cancel();
  attempt_timer_.cancel();
  resolver_.cancel();
  if (conn_) {
    conn_->done = true;
    boost::system::error_code ignored;
    conn_->socket.close(ignored);
  }
}

}  // namespace muster::rendezvous
