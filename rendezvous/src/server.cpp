#include "muster/rendezvous/server.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "muster/common/log.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "muster/rendezvous/tcp_util.hpp"

namespace muster::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using nlohmann::json;

struct RendezvousServer::Job {
  Job(asio::io_context& io, std::string id, Settings s) : id(std::move(id)), settings(s), rdzv(s), timer(io) {}
  std::string id;
  Settings settings;
  Rendezvous rdzv;
  asio::steady_timer timer;
  bool armed = false;
  TimePoint armed_at{};
};

class RendezvousServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(RendezvousServer& server, MemberId id, tcp::socket socket)
      : server_(server), id_(id), socket_(std::move(socket)), alive_(server.alive_) {
    boost::system::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void start(std::string already_read = {}) {
    reader_.feed(already_read);
    asio::co_spawn(socket_.get_executor(), read_loop(shared_from_this()), asio::detached);
  }

  void send(const json& message) {
    if (closed_) return;
    out_.push(encode_frame(message));
    auto self = shared_from_this();
    out_.flush(socket_, self, [self](const boost::system::error_code& ec) {
      if (ec || self->close_after_write_) self->close();
    });
  }

  // Sends the error and closes once it is written.
  void fail(Code code, const std::string& message) {
    log::warning("rendezvous: closing the connection from " + peer_ + ": " + message);
    send(error_message(code, message));
    close_after_write_ = true;
    if (!out_.writing()) close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  MemberId id() const { return id_; }
  Job* job = nullptr;

 private:
  static asio::awaitable<void> read_loop(std::shared_ptr<Session> self) {
    std::array<char, 16384> buf{};
    try {
      bool first = true;
      while (!self->closed_ && !self->close_after_write_) {
        if (!first) {
          std::size_t n = co_await self->socket_.async_read_some(asio::buffer(buf), asio::use_awaitable);
          if (!*self->alive_) co_return;
          self->reader_.feed(std::string_view(buf.data(), n));
        }
        first = false;
        while (!self->closed_ && !self->close_after_write_) {
          auto frame = self->reader_.next();
          if (!frame.ok()) {
            self->fail(Code::invalid_argument, frame.status().message());
            break;
          }
          if (!frame.value()) break;
          self->server_.handle(*self, *frame.value());
        }
      }
    } catch (const boost::system::system_error&) {
      // The peer went away.
    }
    if (*self->alive_) self->server_.gone(*self);
  }

  friend class RendezvousServer;
  RendezvousServer& server_;
  MemberId id_;
  tcp::socket socket_;
  std::shared_ptr<bool> alive_;
  std::string peer_;
  FrameReader reader_;
  net::WriteQueue out_;
  bool closed_ = false;
  bool close_after_write_ = false;
};

RendezvousServer::RendezvousServer(asio::io_context& io)
    : io_(io), acceptor_(io), retry_timer_(io), alive_(std::make_shared<bool>(true)) {}

RendezvousServer::~RendezvousServer() { close(); }

std::unique_ptr<RendezvousServer> RendezvousServer::create(asio::io_context& io) {
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(io));
}

void RendezvousServer::adopt(tcp::socket socket, std::string already_read) {
  if (!*alive_) return;
  MemberId id = next_member_++;
  auto session = std::make_shared<Session>(*this, id, std::move(socket));
  sessions_[id] = session;
  session->start(std::move(already_read));
}

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::listen(asio::io_context& io, const std::string& host,
                                                                   int port) {
  std::unique_ptr<RendezvousServer> server(new RendezvousServer(io));
  auto bound = net::open_listener(server->acceptor_, host, port, "the rendezvous");
  if (!bound.ok()) return bound.status();
  server->port_ = bound.value();
  server->accept();
  return server;
}

void RendezvousServer::accept() {
  net::accept_forever(acceptor_, retry_timer_, alive_, "rendezvous", [this](tcp::socket socket) {
    MemberId id = next_member_++;
    auto session = std::make_shared<Session>(*this, id, std::move(socket));
    sessions_[id] = session;
    session->start();
  });
}

void RendezvousServer::handle(Session& s, const std::string& payload) {
  auto parsed = parse_message(payload);
  if (!parsed.ok()) return s.fail(Code::invalid_argument, parsed.status().message());
  const json& msg = parsed.value();
  const std::string type = msg["type"].get<std::string>();
  auto now = Clock::now();
  if (type == "join") {
    auto join = join_from_json(msg);
    if (!join.ok()) return s.fail(Code::invalid_argument, join.status().message());
    const auto& m = join.value();
    if (s.job != nullptr && s.job->id != m.job) {
      return s.fail(Code::invalid_argument, "this connection already belongs to job '" + s.job->id +
                                                "'; one connection serves one job");
    }
    auto it = jobs_.find(m.job);
    if (it == jobs_.end()) {
      it = jobs_.emplace(m.job, std::make_unique<Job>(io_, m.job, m.settings)).first;
      log::info("rendezvous: job '" + m.job + "' created for " + std::to_string(m.settings.min_nodes) + ":" +
                std::to_string(m.settings.max_nodes) + " nodes");
    } else if (it->second->settings.min_nodes != m.settings.min_nodes ||
               it->second->settings.max_nodes != m.settings.max_nodes ||
               it->second->settings.static_ranks != m.settings.static_ranks) {
      json reject = {{"type", "reject"}, {"v", kProtocolVersion}, {"code", code_name(Code::invalid_argument)},
                     {"message", "job '" + m.job + "' runs with --nnodes=" +
                                     std::to_string(it->second->settings.min_nodes) + ":" +
                                     std::to_string(it->second->settings.max_nodes) + " and this node asked for " +
                                     std::to_string(m.settings.min_nodes) + ":" +
                                     std::to_string(m.settings.max_nodes) + "; give every node the same --nnodes"}};
      s.send(reject);
      return;
    }
    s.job = it->second.get();
    deliver(*s.job, s.job->rdzv.join(s.id(), m.request, now));
    rearm(*s.job);
    return;
  }
  if (s.job == nullptr) {
    return s.fail(Code::invalid_argument, "'" + type + "' before 'join': a connection starts with a join");
  }
  Job& job = *s.job;
  if (type == "heartbeat") {
    job.rdzv.heartbeat(s.id(), now);
  } else if (type == "workers_failed") {
    int round = msg.value("round", -1);
    auto failure = failure_from_json(msg.value("failure", json::object()));
    if (!failure.ok()) return s.fail(Code::invalid_argument, failure.status().message());
    deliver(job, job.rdzv.workers_failed(s.id(), round, failure.value(), now));
  } else if (type == "workers_succeeded") {
    deliver(job, job.rdzv.workers_succeeded(s.id(), msg.value("round", -1), now));
  } else if (type == "leave") {
    deliver(job, job.rdzv.leave(s.id(), now));
    s.job = nullptr;
  } else {
    return s.fail(Code::invalid_argument, "unknown message type '" + type + "'");
  }
  rearm(job);
}

void RendezvousServer::deliver(Job& job, const std::vector<Output>& outputs) {
  for (const auto& o : outputs) {
    MemberId member = std::visit([](const auto& x) { return x.member; }, o);
    auto it = sessions_.find(member);
    if (it == sessions_.end()) continue;
    it->second->send(to_json(o));
    if (std::holds_alternative<out::Reject>(o) || std::holds_alternative<out::Finished>(o)) {
      // The member is no longer part of the job; it may join another round of
      // a new job on the same connection.
      if (it->second->job == &job) it->second->job = nullptr;
    }
  }
}

// Re-arms the job's timer, cheaply: an event cannot make anything due before
// now + shortest_timeout(), so a timer already set earlier stays (the full,
// O(members) look-up runs only when the timer fires). This keeps a join flood
// of N agents at O(N) work.
void RendezvousServer::rearm(Job& job, bool full) {
  auto now = Clock::now();
  auto earliest = now + job.rdzv.shortest_timeout();
  if (!full && job.armed) {
    if (job.armed_at <= earliest) return;
    // Firing early is harmless: the tick finds nothing due and re-arms in full.
    arm(job, earliest);
    return;
  }
  auto next = job.rdzv.next_deadline();
  job.timer.cancel();
  job.armed = false;
  if (!next) return;
  arm(job, *next);
}

void RendezvousServer::arm(Job& job, TimePoint at) {
  job.timer.cancel();
  job.armed = true;
  job.armed_at = at;
  job.timer.expires_at(at);
  Job* j = &job;
  auto alive = alive_;
  job.timer.async_wait([this, j, alive](const boost::system::error_code& ec) {
    if (ec || !*alive) return;
    j->armed = false;
    deliver(*j, j->rdzv.tick(Clock::now()));
    rearm(*j, true);
  });
}

void RendezvousServer::gone(Session& s) {
  MemberId id = s.id();
  if (s.job != nullptr) {
    Job& job = *s.job;
    s.job = nullptr;
    deliver(job, job.rdzv.leave(id, Clock::now()));
    rearm(job);
  }
  sessions_.erase(id);
}

void RendezvousServer::close() {
  if (!*alive_) return;
  *alive_ = false;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  for (auto& [id, s] : sessions_) s->close();
  sessions_.clear();
  for (auto& [id, j] : jobs_) j->timer.cancel();
  jobs_.clear();
}

}  // namespace muster::rendezvous
