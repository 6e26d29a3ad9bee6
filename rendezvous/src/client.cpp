#include "muster/rendezvous/client.hpp"

#include "muster/rendezvous/tcp_util.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/write.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace muster::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

RendezvousClient::RendezvousClient(asio::io_context& io, std::string host, int port, OnMessage on_message,
                                   OnError on_error)
    : io_(io),
      host_(std::move(host)),
      port_(port),
      on_message_(std::move(on_message)),
      on_error_(std::move(on_error)),
      socket_(io),
      resolver_(io),
      retry_timer_(io),
      heartbeat_timer_(io) {}

std::string RendezvousClient::address() const {
  return (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

void RendezvousClient::connect(Duration deadline, std::function<void()> on_connected) {
  deadline_ = Clock::now() + deadline;
  on_connected_ = std::move(on_connected);
  attempt();
}

void RendezvousClient::attempt() {
  auto self = shared_from_this();
  resolver_.async_resolve(host_, std::to_string(port_), [self](const boost::system::error_code& ec,
                                                               tcp::resolver::results_type results) {
    if (self->closed_) return;
    auto retry = [self](const std::string& why) {
      self->last_error_ = why;
      if (Clock::now() + self->backoff_ >= self->deadline_) {
        self->on_error_(Status(Code::unavailable, "cannot reach the rendezvous at " + self->address() + ": " +
                                                      self->last_error_ +
                                                      "; check --rdzv-endpoint and that its host is up"));
        return;
      }
      self->retry_timer_.expires_after(self->backoff_);
      self->backoff_ = std::min(self->backoff_ * 2, Duration(2000));
      self->retry_timer_.async_wait([self](const boost::system::error_code& e) {
        if (!e && !self->closed_) self->attempt();
      });
    };
    if (ec) return retry(ec.message());
    asio::async_connect(self->socket_, results, [self, retry](const boost::system::error_code& e, const tcp::endpoint&) {
      if (self->closed_) return;
      if (e) {
        boost::system::error_code ignored;
        self->socket_.close(ignored);
        return retry(e.message());
      }
      boost::system::error_code ignored;
      self->socket_.set_option(tcp::no_delay(true), ignored);
      self->connected_ = true;
      self->read_more();
      self->flush();
      if (self->on_connected_) self->on_connected_();
    });
  });
}

void RendezvousClient::send(const nlohmann::json& message) {
  if (closed_) return;
  out_.push(encode_frame(message));
  if (connected_) flush();
}

void RendezvousClient::flush() {
  auto self = shared_from_this();
  out_.flush(socket_, self, [self](const boost::system::error_code& ec) {
    if (ec && !self->closed_) {
      self->on_error_(Status(Code::unavailable, "lost the rendezvous at " + self->address() + ": " + ec.message()));
    }
  });
}

void RendezvousClient::read_more() {
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(buf_), [self](const boost::system::error_code& ec, std::size_t n) {
    if (self->closed_) return;
    if (n > 0) {
      self->reader_.feed(std::string_view(self->buf_.data(), n));
      while (!self->closed_) {
        auto frame = self->reader_.next();
        if (!frame.ok()) {
          self->on_error_(Status(Code::io_error, "the rendezvous at " + self->address() + " sent a bad frame: " +
                                                     frame.status().message()));
          return;
        }
        if (!frame.value()) break;
        auto msg = parse_message(*frame.value());
        if (!msg.ok()) {
          self->on_error_(Status(Code::io_error, "the rendezvous at " + self->address() + " sent a bad message: " +
                                                     msg.status().message()));
          return;
        }
        self->on_message_(msg.value());
      }
    }
    if (self->closed_) return;
    if (ec) {
      self->on_error_(Status(Code::unavailable, "lost the rendezvous at " + self->address() + ": " +
                                                    (ec == asio::error::eof ? "the server closed the connection"
                                                                            : ec.message())));
      return;
    }
    self->read_more();
  });
}

void RendezvousClient::start_heartbeats(Duration interval, Duration give_up_after) {
  // Heartbeats nobody acknowledges (the link is cut, the server's host
  // vanished) make the kernel fail the connection after give_up_after, so an
  // agent cut off from its job learns it instead of waiting forever.
  if (socket_.is_open() && give_up_after.count() > 0) {
    unsigned int ms = static_cast<unsigned int>(give_up_after.count());
    ::setsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
  }
  heartbeat_loop(interval);
}

void RendezvousClient::heartbeat_loop(Duration interval) {
  auto self = shared_from_this();
  heartbeat_timer_.expires_after(interval);
  heartbeat_timer_.async_wait([self, interval](const boost::system::error_code& ec) {
    if (ec || self->closed_) return;
    self->send(heartbeat_message());
    self->heartbeat_loop(interval);
  });
}

void RendezvousClient::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  retry_timer_.cancel();
  heartbeat_timer_.cancel();
  resolver_.cancel();
  socket_.close(ignored);
}

}  // namespace muster::rendezvous
