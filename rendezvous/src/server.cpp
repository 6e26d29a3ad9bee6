#include "muster/rendezvous/server.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "muster/common/log.hpp"
#include "muster/rendezvous/handshake.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "muster/net/asio_tcp.hpp"
#include "muster/common/duration.hpp"
#include "muster/common/text.hpp"

namespace muster::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using nlohmann::json;

struct RendezvousServer::Job : std::enable_shared_from_this<Job> {
  Job(asio::io_context& io, std::string id, Settings s) : id(std::move(id)), settings(s), rdzv(s), timer(io) {}
  std::string id;
  Settings settings;
  Rendezvous rdzv;
  asio::steady_timer timer;
  TimePoint created = Clock::now();
  bool armed = false;
  TimePoint armed_at{};
};

class RendezvousServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(RendezvousServer& server, MemberId id, tcp::socket socket)
      : server_(server), id_(id), socket_(std::move(socket)), join_timer_(socket_.get_executor()),
        alive_(server.sessions_.alive()) {
    boost::system::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_address_ = ec ? "?" : ep.address().to_string();
    peer_ = ec ? "?" : peer_address_ + ":" + std::to_string(ep.port());
  }

  void start(std::string already_read = {}) {
    reader_.feed(already_read);
    // A connection that never joins holds a descriptor for nothing.
    auto self = shared_from_this();
    join_timer_.expires_after(server_.limits_.join_wait);
    join_timer_.async_wait([self](const boost::system::error_code& ec) {
      if (ec || !*self->alive_ || self->joined_ || self->closed_) return;
      self->fail(Code::timeout, "no join within " + std::to_string(self->server_.limits_.join_wait.count()) +
                                    " ms of connecting");
    });
    asio::co_spawn(socket_.get_executor(), read_loop(self), asio::detached);
  }

  void send(const json& message) {
    if (closed_) return;
    std::string text = dump_message(message);
    out_.push(frame_of(channel_ ? channel_->seal(text) : text));
    if (out_.queued() > server_.limits_.max_queued_bytes) {
      log::warning("rendezvous: closing the connection from " + peer_ + ": it has not read " +
                   std::to_string(out_.queued()) + " bytes sent to it");
      close();
      return;
    }
    auto self = shared_from_this();
    out_.flush(socket_, self, [self](const boost::system::error_code& ec) {
      if (ec || self->close_after_write_) self->close();
    });
  }

  // Sends the error and closes once it is written.
  void fail(Code code, const std::string& message) {
    if (closed_ || close_after_write_) return;
    server_.count_rejected(code == Code::auth_failed       ? Rejection::auth
                           : code == Code::timeout          ? Rejection::no_join
                           : code == Code::invalid_argument ? Rejection::bad_message
                                                            : Rejection::internal);
    log::warning("rendezvous: closing the connection from " + peer_ + ": " + log_excerpt(message, 300));
    send_last(error_message(code, message));
  }

  // Sends the connection's last message and closes once it is written.
  void send_last(const json& message) {
    send(message);
    close_after_write_ = true;
    if (!out_.writing()) close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    join_timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  void joined() {
    joined_ = true;
    join_timer_.cancel();
  }

  MemberId id() const { return id_; }
  const std::string& peer_address() const { return peer_address_; }
  std::shared_ptr<Job> job;

 private:
  static asio::awaitable<void> read_loop(std::shared_ptr<Session> self) {
    try {
      bool first = true;
      while (!self->closed_ && !self->close_after_write_) {
        if (!first) {
          boost::system::error_code ec;
          auto bytes = co_await self->input_.read(self->socket_, ec);
          if (!*self->alive_) co_return;
          if (ec) {
            // The peer went away. A clean end of stream from its side (not
            // after this server closed or failed the session) is a close of
            // its own, without leave: its agent is most likely gone.
            self->closed_by_peer_ = ec == asio::error::eof && !self->closed_ && !self->close_after_write_;
            break;
          }
          self->reader_.feed(bytes);
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
    } catch (const std::exception& e) {
      log::warning("rendezvous: closing the connection from " + self->peer_ + ": " + e.what());
    }
    if (*self->alive_) self->server_.gone(*self);
  }

  friend class RendezvousServer;
  RendezvousServer& server_;
  MemberId id_;
  tcp::socket socket_;
  net::Reader input_;
  asio::steady_timer join_timer_;
  std::shared_ptr<bool> alive_;
  std::string peer_address_;
  std::string peer_;
  FrameReader reader_;
  net::WriteQueue out_;
  // Authentication, when the server had a key as the connection was
  // accepted (a key set later does not apply to it): the handshake until the
  // agent has proved itself, then the channel.
  std::optional<ServerHandshake> handshake_;
  std::optional<auth::Channel> channel_;
  bool closed_ = false;
  bool close_after_write_ = false;
  bool joined_ = false;
  bool closed_by_peer_ = false;
};

RendezvousServer::RendezvousServer(asio::io_context& io, ServerLimits limits)
    : io_(io), limits_(limits), sessions_(io, [this](tcp::socket socket, std::string already_read) {
        add_session(std::move(socket), std::move(already_read));
      }) {}

RendezvousServer::~RendezvousServer() { close(); }

std::unique_ptr<RendezvousServer> RendezvousServer::create(asio::io_context& io, ServerLimits limits) {
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(io, limits));
}

void RendezvousServer::adopt(tcp::socket socket, std::string already_read) {
  sessions_.adopt(std::move(socket), std::move(already_read));
}

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::listen(asio::io_context& io, const std::string& host,
                                                                   int port, ServerLimits limits) {
  std::unique_ptr<RendezvousServer> server(new RendezvousServer(io, limits));
  auto bound = server->sessions_.listen(host, port, "the rendezvous", "rendezvous");
  if (!bound.ok()) return bound.status();
  return server;
}

void RendezvousServer::add_session(tcp::socket socket, std::string already_read) {
  MemberId id = sessions_.next_id();
  auto session = std::make_shared<Session>(*this, id, std::move(socket));
  auto& count = per_peer_[session->peer_address()];
  if (count >= limits_.max_connections_per_peer) {
    static TimePoint last_said{};
    auto now = Clock::now();
    if (now - last_said > std::chrono::seconds(5)) {
      last_said = now;
      log::warning("rendezvous: refusing connections from " + session->peer_address() + ": it holds " +
                   std::to_string(count) + ", the limit per address");
    }
    count_rejected(Rejection::connections_per_peer);
    session->close();
    return;
  }
  ++count;
  if (key_) session->handshake_.emplace(key_, previous_key_);
  sessions_.add(id, session);
  session->start(std::move(already_read));
}

void RendezvousServer::handle(Session& s, const std::string& payload) {
  try {
    std::string opened;
    const bool keyed = s.handshake_.has_value();
    if (keyed) {
      if (!s.channel_) return handshake(s, payload);
      auto m = s.channel_->open(payload);
      if (!m.ok()) return s.fail(Code::auth_failed, m.status().message());
      opened = std::move(m.value());
    }
    auto parsed = parse_message(keyed ? opened : payload);
    if (!parsed.ok()) return s.fail(Code::invalid_argument, parsed.status().message());
    const json& msg = parsed.value();
    const std::string& type = msg["type"].get_ref<const std::string&>();
    if (type == "join") return handle_join(s, msg);
    if (type == "hello" || type == "auth") {
      return s.fail(Code::auth_failed,
                    keyed ? "'" + type + "' on a connection that has already authenticated"
                         : "this rendezvous has no auth key, and the agent has one: give the rendezvous and every "
                           "agent the same --auth-key-file, or none of them");
    }
    // A member the job let go of (fenced, finished) may still heartbeat or
    // report on its old round before it reads why: that is no error.
    if (s.job == nullptr && s.joined_ &&
        (type == "heartbeat" || type == "leave" || type == "workers_failed" || type == "workers_succeeded" ||
         type == "hung")) {
      return;
    }
    // An operator's questions, on any connection (musterctl's has no job).
    if (type == "jobs") return answer_jobs(s, msg);
    if (type == "job") return answer_job(s, msg);
    if (type == "stacks") return answer_stacks(s, msg);
    if (type == "health" && s.job == nullptr && !s.joined_) return note_health(s, msg);
    if (s.job == nullptr) {
      return s.fail(Code::invalid_argument,
                    "'" + log_excerpt(type, 64) + "' before 'join': a connection starts with a join");
    }
    std::shared_ptr<Job> job = s.job;  // holds the job while it is worked on
    auto now = Clock::now();
    if (type == "heartbeat") {
      auto beat = heartbeat_from_json(msg);
      if (!beat.ok()) return s.fail(Code::invalid_argument, beat.status().message());
      auto released = job->rdzv.heartbeat(s.id(), now);
      if (beat->seq) s.send(heartbeat_ack_message(*beat->seq));
      if (!released.empty()) deliver(*job, std::move(released));
      if (beat->progress) {
        if (auto p = job->rdzv.progress(s.id(), now)) s.send(to_json(Output(*p)));
      }
    } else if (type == "workers_failed") {
      auto m = workers_failed_from_json(msg);
      if (!m.ok()) return s.fail(Code::invalid_argument, m.status().message());
      deliver(*job, job->rdzv.workers_failed(s.id(), m->round, m->failure, now));
    } else if (type == "workers_succeeded") {
      auto m = workers_succeeded_from_json(msg);
      if (!m.ok()) return s.fail(Code::invalid_argument, m.status().message());
      deliver(*job, job->rdzv.workers_succeeded(s.id(), m->round, now));
    } else if (type == "hung") {
      auto m = hung_from_json(msg);
      if (!m.ok()) return s.fail(Code::invalid_argument, m.status().message());
      deliver(*job, job->rdzv.worker_hung(s.id(), m->round, m->global_rank, now));
    } else if (type == "leave") {
      s.job.reset();
      deliver(*job, job->rdzv.leave(s.id(), now));
    } else {
      return s.fail(Code::invalid_argument, "unknown message type '" + log_excerpt(type, 64) + "'");
    }
    rearm(*job);
    retire_if_closed(*job);
  } catch (const std::exception& e) {
    // Nothing above should throw; if something does, only this peer pays.
    s.fail(Code::internal, std::string("the server could not handle the message: ") + e.what());
  }
}

namespace {

long long ms_between(TimePoint from, TimePoint to) {
  return to > from ? std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count() : 0;
}

// A job's failure message in a query reply is cut to this (the page
// budget leaves room for it, escaped six times over, and the summary).
constexpr std::size_t kQueryFailureMessage = 4096;
// Exclusions a `job` reply lists (on its first page, by address).
constexpr std::size_t kQueryExclusions = 64;
// The most of a `job` reply's first page that failing nodes take (beside
// the members' kQueryReplyBytes, well within kMaxFrame).
constexpr std::size_t kQueryUnhealthyBytes = kQueryReplyBytes / 4;
// The most members one job page can hold: a member takes well over 64 bytes of
// JSON, so a page of kQueryReplyBytes never needs more.
constexpr std::size_t kQueryMembersPerPage = kQueryReplyBytes / 64;

}  // namespace

const char* rejection_name(Rejection r) {
  switch (r) {
    case Rejection::auth: return "auth";
    case Rejection::bad_message: return "bad_message";
    case Rejection::no_join: return "no_join";
    case Rejection::connections_per_peer: return "connections_per_peer";
    case Rejection::max_jobs: return "max_jobs";
    case Rejection::job_closed: return "job_closed";
    case Rejection::job_settings: return "job_settings";
    case Rejection::internal: return "internal";
  }
  return "internal";
}

JobSummary RendezvousServer::summarize(const Job& job, TimePoint now) {
  JobSummary js;
  js.id = job.id;
  js.state = state_name(job.rdzv.state());
  js.nodes = static_cast<int>(job.rdzv.members());
  js.in_round = static_cast<int>(job.rdzv.participants());
  js.min_nodes = job.settings.min_nodes;
  js.max_nodes = job.settings.max_nodes;
  js.round = job.rdzv.round();
  js.restarts = job.rdzv.restart_count();
  js.max_restarts = job.settings.max_restarts;
  js.age_ms = ms_between(job.created, now);
  return js;
}

JobSummary RendezvousServer::summarize(const std::string& id, const Tombstone& t, TimePoint now) {
  JobSummary js = t.summary;
  js.id = id;
  js.age_ms = ms_between(t.created, now);
  return js;
}

void RendezvousServer::answer_jobs(Session& s, const json& msg) {
  auto q = jobs_query_from_json(msg);
  if (!q.ok()) return s.fail(Code::invalid_argument, q.status().message());
  auto now = Clock::now();
  expire_tombstones(now);
  JobsReply reply;
  auto live = q->after.empty() ? jobs_.begin() : jobs_.upper_bound(q->after);
  auto done = q->after.empty() ? tombstones_.begin() : tombstones_.upper_bound(q->after);
  std::size_t bytes = 0;
  // Open and finished jobs merged by id (an id is never both).
  while (live != jobs_.end() || done != tombstones_.end()) {
    bool take_live = done == tombstones_.end() || (live != jobs_.end() && live->first < done->first);
    JobSummary js = take_live ? summarize(*live->second, now) : summarize(done->first, done->second, now);
    bytes += dump_message(to_json(js)).size() + 1;
    if (bytes > kQueryReplyBytes && !reply.jobs.empty()) {
      reply.next_after = reply.jobs.back().id;
      break;
    }
    reply.jobs.push_back(std::move(js));
    if (take_live) ++live;
    else ++done;
  }
  s.send(to_json(reply));
}

// Not a fault of the connection: said, and closed, without a warning.
void RendezvousServer::not_found(Session& s, const std::string& text) {
  s.send_last(error_message(Code::not_found, text));
}

void RendezvousServer::answer_stacks(Session& s, const json& msg) {
  auto q = stacks_query_from_json(msg);
  if (!q.ok()) return s.fail(Code::invalid_argument, q.status().message());
  auto it = jobs_.find(q->job);
  if (it == jobs_.end()) return not_found(s, "no open job '" + log_excerpt(q->job, 64) + "' here");
  std::shared_ptr<Job> job = it->second;
  std::size_t unable = 0;
  auto orders = job->rdzv.request_stacks("musterctl", unable);
  StacksReply reply;
  reply.state = state_name(job->rdzv.state());
  reply.asked = static_cast<int>(orders.size());
  reply.unable = static_cast<int>(unable);
  log::warning("rendezvous: job '" + log_excerpt(job->id, 64) + "': musterctl asked for the workers' stacks: " +
               std::to_string(reply.asked) + " agent(s) take them" +
               (unable > 0 ? ", " + std::to_string(unable) + " cannot (an older muster)" : std::string()));
  deliver(*job, orders);
  s.send(to_json(reply));
}

void RendezvousServer::note_health(Session& s, const json& msg) {
  auto r = health_report_from_json(msg);
  if (!r.ok()) return s.fail(Code::invalid_argument, r.status().message());
  ++health_reports_;
  health_.report(r.value(), Clock::now());
  log::warning("rendezvous: job '" + log_excerpt(r->job, 64) + "': node " + log_excerpt(r->node, 128) + " (" +
               log_excerpt(r->address, 128) + ") stays out: its health check failed (" + std::to_string(r->failures) +
               (r->failures == 1 ? " time" : " times") + "): " + log_excerpt(r->detail, 300) +
               (r->retry_in_ms > 0 ? "; it tries again in " + seconds_text(Duration(r->retry_in_ms)) : std::string()));
  s.send_last(health_noted_message());
}

void RendezvousServer::answer_job(Session& s, const json& msg) {
  auto q = job_query_from_json(msg);
  if (!q.ok()) return s.fail(Code::invalid_argument, q.status().message());
  auto now = Clock::now();
  expire_tombstones(now);
  // Nodes whose check fails, on the first page (they are no members), as
  // many as fit in kQueryUnhealthyBytes as sent.
  auto add_unhealthy = [&](JobReply& reply) {
    if (q->from != 0) return;
    std::size_t bytes = 0;
    for (const auto& e : health_.of(q->job, now)) {
      UnhealthySummary u{e.report.node,   e.report.address,           e.report.role,         e.report.failures,
                         e.report.detail, ms_between(e.reported, now), e.report.retry_in_ms};
      bytes += dump_message(to_json(u)).size() + 1;
      if (bytes > kQueryUnhealthyBytes) break;
      reply.unhealthy.push_back(std::move(u));
    }
  };
  auto it = jobs_.find(q->job);
  if (it == jobs_.end()) {
    JobReply reply;
    auto t = tombstones_.find(q->job);
    if (t == tombstones_.end()) {
      add_unhealthy(reply);
      if (reply.unhealthy.empty()) return not_found(s, "no job '" + log_excerpt(q->job, 64) + "' here");
      // No node has joined: the ones that would have stay out, failing their check.
      reply.job.id = q->job;
      reply.job.state = kNotJoinedState;
      return s.send(to_json(reply));
    }
    reply.job = summarize(t->first, t->second, now);
    reply.last_failure = t->second.failure;
    reply.last_failure_node = t->second.failure_node;
    reply.last_failure_ms_ago = ms_between(t->second.failure_at, now);
    add_unhealthy(reply);
    return s.send(to_json(reply));
  }
  const Job& job = *it->second;
  JobView view = job.rdzv.view(now, static_cast<std::size_t>(q->from), kQueryMembersPerPage);
  JobReply reply;
  reply.job = summarize(job, now);
  reply.total_members = static_cast<int>(view.total_members);
  std::size_t bytes = 0;
  for (std::size_t k = 0; k < view.members.size(); ++k) {
    const MemberView& m = view.members[k];
    std::size_t i = static_cast<std::size_t>(q->from) + k;
    MemberSummary ms;
    ms.node = m.node_name;
    ms.address = m.address;
    ms.role = m.role;
    ms.local_world_size = m.local_world_size;
    ms.group_rank = m.group_rank;
    ms.in_round = m.in_round;
    ms.waiting = m.waiting;
    ms.connected = m.connected;
    ms.heard_ms_ago = std::max<long long>(0, m.since_heard.count());
    if (m.parked_for) ms.parked_ms = m.parked_for->count();
    // Measured as sent (escapes included), so a page stays far below kMaxFrame.
    bytes += dump_message(to_json(ms)).size() + 1;
    if (bytes > kQueryReplyBytes && !reply.members.empty()) {
      reply.next_from = static_cast<int>(i);
      break;
    }
    reply.members.push_back(std::move(ms));
  }
  std::size_t after_page = static_cast<std::size_t>(q->from) + view.members.size();
  if (!reply.next_from && after_page < view.total_members) {
    reply.next_from = static_cast<int>(after_page);
  }
  if (view.last_failure) {
    reply.last_failure = view.last_failure;
    if (reply.last_failure->message.size() > kQueryFailureMessage) {
      reply.last_failure->message.resize(kQueryFailureMessage);
    }
    reply.last_failure_node = view.last_failure_node;
    reply.last_failure_ms_ago = view.since_last_failure ? view.since_last_failure->count() : 0;
  }
  // Exclusions on the first page: up to kQueryExclusions, by address.
  if (q->from == 0) {
    for (std::size_t i = 0; i < view.exclusions.size() && i < kQueryExclusions; ++i) {
      const auto& e = view.exclusions[i];
      reply.exclusions.push_back({e.address, e.node_name, e.why, e.count, e.left.count()});
    }
  }
  add_unhealthy(reply);
  s.send(to_json(reply));
}

// The connection has not proved it holds the key yet (handshake.hpp).
void RendezvousServer::handshake(Session& s, const std::string& payload) {
  auto parsed = parse_message(payload);
  if (!parsed.ok()) return s.fail(Code::invalid_argument, parsed.status().message());
  auto step = s.handshake_->on_message(parsed.value());
  if (!step.ok()) return s.fail(step.status().code(), step.status().message());
  if (!step->reply.is_null()) s.send(step->reply);
  if (s.handshake_->done()) s.channel_.emplace(std::move(step->session_key), auth::Channel::Side::server);
}

void RendezvousServer::handle_join(Session& s, const json& msg) {
  auto join = join_from_json(msg);
  if (!join.ok()) return s.fail(Code::invalid_argument, join.status().message());
  const auto& m = join.value();
  // A node that joins has passed its check (or has none): off the board.
  health_.joined(m.job, m.request.node_name);
  if (s.job != nullptr && s.job->id != m.job) {
    return s.fail(Code::invalid_argument, "this connection already belongs to job '" + log_excerpt(s.job->id, 64) +
                                              "'; one connection serves one job");
  }
  auto now = Clock::now();
  expire_tombstones(now);
  auto reject = [&](Code code, const std::string& message) {
    count_rejected(code == Code::unavailable ? Rejection::max_jobs
                   : code == Code::closed    ? Rejection::job_closed
                                             : Rejection::job_settings);
    s.send(to_json(Output{out::Reject{0, code, message}}));  // member: not one yet
  };
  // A session displaced from its job (its node joined again elsewhere, the job
  // retired) looks the job up afresh.
  if (s.job != nullptr) {
    auto live = jobs_.find(s.job->id);
    if (live == jobs_.end() || live->second != s.job) s.job.reset();
  }
  std::shared_ptr<Job> job = s.job;
  if (job == nullptr) {
    auto it = jobs_.find(m.job);
    if (it != jobs_.end()) {
      job = it->second;
    } else if (auto t = tombstones_.find(m.job); t != tombstones_.end()) {
      // A member that resumes with its workers done learns how the job ended
      // (its `finished` was lost with the connection).
      if (t->second.success && m.request.resume && m.request.resume->outcome == Resume::Outcome::succeeded) {
        return s.send(to_json(Output(out::Finished{s.id(), true, std::nullopt, "every node's workers succeeded"})));
      }
      return reject(Code::closed, closed_job_text(t->second.success));
    } else if (jobs_.size() >= limits_.max_jobs) {
      log::warning("rendezvous: refusing job '" + log_excerpt(m.job, 64) + "': " + std::to_string(jobs_.size()) +
                   " jobs are open, the limit");
      return reject(Code::unavailable, "the rendezvous holds " + std::to_string(jobs_.size()) +
                                           " open jobs, its limit; try again when one has finished");
    } else {
      job = std::make_shared<Job>(io_, m.job, m.settings);
      if (reserved_ && reserved_->job == m.job) job->rdzv.reserve_node_rank(reserved_->rank);
      jobs_.emplace(m.job, job);
      log::info("rendezvous: job '" + log_excerpt(m.job, 64) + "' created for " +
                std::to_string(m.settings.min_nodes) + ":" + std::to_string(m.settings.max_nodes) + " nodes");
    }
  }
  if (auto st = job->rdzv.accepts_settings(m.job, m.settings); !st.ok()) return reject(st.code(), st.message());
  s.job = job;
  s.joined();
  // deliver() may clear s.job (a reject): only `job` is used after it.
  deliver(*job, job->rdzv.join(s.id(), m.request, now));
  rearm(*job);
  retire_if_closed(*job);
}

void RendezvousServer::deliver(Job& job, const std::vector<Output>& outputs) {
  for (const auto& o : outputs) {
    if (const auto* l = std::get_if<out::Log>(&o)) {
      std::string line = "rendezvous: job '" + log_excerpt(job.id, 64) + "': " + log_excerpt(l->text, 2000);
      if (l->warning) log::warning(line);
      else log::info(line);
      continue;
    }
    MemberId member = std::visit([](const auto& x) { return x.member; }, o);
    Session* session = sessions_.find(member);
    if (!session) continue;
    session->send(to_json(o));
    const auto* fenced = std::get_if<out::Fenced>(&o);
    // An excluded member stays one (parked): its connection stays with the job.
    if (std::holds_alternative<out::Reject>(o) || std::holds_alternative<out::Finished>(o) ||
        (fenced && !fenced->excluded_for)) {
      // The member is no longer part of the job; it may join another round of
      // a new job on the same connection.
      if (session->job.get() == &job) session->job.reset();
    }
  }
}

// A closed job becomes a tombstone; a job that every member left is
// forgotten (nothing happened in it that a newcomer must learn).
void RendezvousServer::retire_if_closed(Job& job) {
  bool closed = job.rdzv.state() == State::closed;
  if (!closed && job.rdzv.members() > 0) return;
  auto it = jobs_.find(job.id);
  if (it == jobs_.end() || it->second.get() != &job) return;
  std::shared_ptr<Job> keep = it->second;  // job stays valid to the end of this function
  retired_ += job.rdzv.counters();
  jobs_.erase(it);
  job.timer.cancel();
  job.armed = false;
  if (!closed) return;
  auto now = Clock::now();
  // A tombstoned id cannot open a job until its tombstone is gone, so the id is new here.
  Tombstone t;
  t.success = job.rdzv.succeeded();
  t.expires = saturating_add(now, limits_.finished_job_lifetime);
  t.created = job.created;
  t.summary = summarize(job, now);
  t.summary.state = t.success ? "succeeded" : "failed";
  t.summary.nodes = t.summary.in_round = 0;
  JobView view = job.rdzv.view(now, 0, 0);
  if (!t.success && view.last_failure) {
    t.failure = view.last_failure;
    if (t.failure->message.size() > kTombstoneMessage) t.failure->message.resize(kTombstoneMessage);
    t.failure_node = view.last_failure_node;
    t.failure_at = now - view.since_last_failure.value_or(Duration(0));
  }
  auto [slot, added] = tombstones_.insert_or_assign(job.id, t);
  if (added) tombstone_order_.push_back(slot);
  while (tombstones_.size() > limits_.max_tombstones && !tombstone_order_.empty()) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
  log::info("rendezvous: job '" + log_excerpt(job.id, 64) + "' " + (job.rdzv.succeeded() ? "finished" : "failed"));
}

std::optional<JobSummary> RendezvousServer::job_summary(const std::string& id) const {
  auto now = Clock::now();
  if (auto it = jobs_.find(id); it != jobs_.end()) return summarize(*it->second, now);
  if (auto t = tombstones_.find(id); t != tombstones_.end()) return summarize(id, t->second, now);
  return std::nullopt;
}

ServerStats RendezvousServer::stats() const {
  ServerStats st;
  for (const char* state : {"forming", "running", "closed", "succeeded", "failed"}) st.jobs[state] = 0;
  st.totals = retired_;
  for (const auto& [id, job] : jobs_) {
    ++st.jobs[state_name(job->rdzv.state())];
    st.nodes += job->rdzv.members();
    st.totals += job->rdzv.counters();
  }
  for (const auto& [id, t] : tombstones_) ++st.jobs[t.success ? "succeeded" : "failed"];
  st.connections = sessions_.size();
  for (Rejection r : kRejections) st.rejected[rejection_name(r)] = rejected_[static_cast<std::size_t>(r)];
  st.behind = behind_;
  st.behind_seconds = behind_seconds_;
  st.health_reports = health_reports_;
  st.unhealthy = health_.live(Clock::now());
  return st;
}

void RendezvousServer::expire_tombstones(TimePoint now) {
  while (!tombstone_order_.empty() && tombstone_order_.front()->second.expires <= now) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
}

// Re-arms the job's timer, cheaply: an event cannot make anything due before
// now + shortest_timeout(), so a timer already set earlier stays (the full,
// O(members) look-up runs only when the timer fires). This keeps a join flood
// of N agents at O(N) work.
void RendezvousServer::rearm(Job& job, bool full) {
  auto now = Clock::now();
  auto earliest = saturating_add(now, job.rdzv.shortest_timeout());
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
  std::weak_ptr<Job> weak = job.shared_from_this();
  auto alive = sessions_.alive();
  job.timer.async_wait([this, weak, alive](const boost::system::error_code& ec) {
    if (ec || !*alive) return;
    auto j = weak.lock();
    if (!j) return;
    j->armed = false;
    try {
      auto now = Clock::now();
      // Late: the loop could neither get here nor read heartbeats meanwhile.
      if (auto late = std::chrono::duration_cast<Duration>(now - j->armed_at); late >= kLagTolerance) {
        behind(*j, late, now);
      }
      deliver(*j, j->rdzv.tick(now));
      rearm(*j, true);
      retire_if_closed(*j);
    } catch (const std::exception& e) {
      log::error("rendezvous: job '" + log_excerpt(j->id, 64) + "': " + e.what());
    }
  });
}

void RendezvousServer::behind(Job& job, Duration late, TimePoint now) {
  job.rdzv.forgive(late, now);
  ++behind_;
  behind_seconds_ += std::chrono::duration<double>(late).count();
  if (behind_said_ && now - *behind_said_ < kBehindNoteEvery) return;
  behind_said_ = now;
  log::warning("rendezvous: this server is behind: job '" + log_excerpt(job.id, 64) + "''s timer ran " +
               seconds_text(late) +
               " late (the machine is short of CPU, or a storm of joins keeps the event loop busy); silence "
               "in that time is not counted against the members (at most the dead-after window each)");
}

void RendezvousServer::gone(Session& s) {
  MemberId id = s.id();
  if (s.handshake_ && s.handshake_->challenged() && !s.close_after_write_) {
    // An agent whose key differs sees that from the challenge and goes.
    log::warning("rendezvous: the connection from " + s.peer_ +
                 " closed before it authenticated; an agent with a different auth key does that");
  }
  if (auto job = std::move(s.job)) {
    // Not a departure: the member keeps its place until it has been silent
    // for the dead-after window (or, when its side closed the connection,
    // for the loss grace), so a reconnect can resume it.
    s.job.reset();
    job->rdzv.disconnected(id, Clock::now(), s.closed_by_peer_ ? Disconnect::closed_by_peer : Disconnect::broken);
    rearm(*job);
  }
  if (auto it = per_peer_.find(s.peer_address()); it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
  // Closed now, not when the last handler holding the session lets go (the
  // join timer); an error frame still being written is let through first.
  if (s.out_.writing()) s.close_after_write_ = true;
  else s.close();
  s.join_timer_.cancel();
  sessions_.erase(id);
}

void RendezvousServer::close() {
  if (!sessions_.open()) return;
  sessions_.close();
  per_peer_.clear();
  for (auto& [id, j] : jobs_) j->timer.cancel();
  jobs_.clear();
}

}  // namespace muster::rendezvous
