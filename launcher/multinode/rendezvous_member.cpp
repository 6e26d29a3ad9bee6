#include "rendezvous_member.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <cstdio>
#include <cstdlib>

#include "muster/common/duration.hpp"
#include "muster/common/log.hpp"
#include "muster/common/random.hpp"
#include "muster/common/text.hpp"
#include "muster/rendezvous/protocol.hpp"

namespace muster::launcher {
namespace {

using nlohmann::json;

// While a round forms, a waiting node says where it stands at most this often.
constexpr std::chrono::seconds kWaitingNoteEvery{5};
// While waiting for a round the heartbeats also ask where it stands, at least this often.
constexpr rendezvous::Duration kProgressEvery{5000};
// A join refused because the rendezvous still holds this node's old
// connection is tried again after this long.
constexpr std::chrono::milliseconds kStaleConnectionRetry{500};

// 128 random bits as hex: no two agents have the same by accident (a PID
// repeats across containers and hosts).
std::string instance_id() {
  if (auto id = random_hex(16); id.ok()) return std::move(id.value());
  // No getrandom (a kernel older than 3.17): time and pid, still unique per host.
  auto t = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
  char out[40];
  std::snprintf(out, sizeof out, "%016llx%016llx", t, static_cast<unsigned long long>(getpid()));
  return out;
}

std::atomic<MemberClock::rep> member_clock_offset{0};  // MemberClock::advance's

}  // namespace

MemberClock::time_point MemberClock::now() noexcept {
  return std::chrono::steady_clock::now() + duration(member_clock_offset.load(std::memory_order_relaxed));
}

void MemberClock::advance(duration d) noexcept { member_clock_offset.fetch_add(d.count(), std::memory_order_relaxed); }

MemberSettings member_settings(const LaunchConfig& cfg) {
  const bool is_static = cfg.rdzv_backend == "static";
  MemberSettings s;
  s.rdzv.min_nodes = cfg.min_nodes;
  s.rdzv.max_nodes = cfg.max_nodes;
  s.rdzv.max_restarts = cfg.max_restarts;
  s.rdzv.join_timeout = cfg.rdzv.join_timeout;
  s.rdzv.last_call_timeout = cfg.rdzv.last_call_timeout;
  s.rdzv.close_timeout = cfg.rdzv.close_timeout;
  s.rdzv.keep_alive_interval = cfg.rdzv.keep_alive_interval;
  s.rdzv.keep_alive_max_attempt = cfg.rdzv.keep_alive_max_attempt;
  s.rdzv.exclude_after = cfg.rdzv.exclude_after;
  s.rdzv.exclude_cooldown = cfg.rdzv.exclude_cooldown;
  if (is_static) {
    // Not elastic: every node of --nnodes's maximum, each with its --node-rank.
    s.rdzv.static_ranks = true;
    s.rdzv.min_nodes = s.rdzv.max_nodes = cfg.max_nodes;
  }
  // Reconnecting for less than the dead-after window would give up on a
  // rendezvous that still counts this node alive.
  s.reconnect_timeout = std::max<rendezvous::Duration>(cfg.rdzv.reconnect_timeout, s.rdzv.dead_after());
  return s;
}

RendezvousMember::RendezvousMember(boost::asio::io_context& io, std::string host, int port, MemberSettings settings,
                                   MemberIdentity identity, std::optional<rendezvous::auth::Key> key,
                                   const AgentCore& core, Events events)
    : settings_(std::move(settings)),
      id_(std::move(identity)),
      name_(id_.address + "_" + instance_id()),
      core_(core),
      events_(std::move(events)),
      health_(io, host, port, key),
      lease_(settings_.rdzv.dead_after()),
      heartbeat_timer_(io),
      lease_timer_(io),
      retry_timer_(io) {
  rdzv_ = std::make_shared<rendezvous::RendezvousClient>(
      io, std::move(host), port, [this](const json& m) { on_message(m); }, [this](const Status& st) { on_error(st); },
      [this](const Status& st) { on_lost(st); });
  // Heartbeats nobody acknowledges (the link is cut, the server's host
  // vanished) make the kernel fail the connection after twice the window.
  rdzv_->set_user_timeout(settings_.rdzv.dead_after() * 2);
  if (key) rdzv_->set_auth_key(std::move(*key));
}

RendezvousMember::~RendezvousMember() {
  left_ = true;
  health_.close();
  rdzv_->close();
}

void RendezvousMember::report_health(uint64_t failures, const std::string& detail, std::chrono::milliseconds retry_in,
                                     std::chrono::milliseconds check_timeout) {
  if (left_) return;
  rendezvous::HealthReport r;
  r.job = id_.job;
  r.node = name_;
  r.address = id_.address;
  r.role = id_.role;
  r.failures = static_cast<int>(std::min<uint64_t>(failures, static_cast<uint64_t>(std::numeric_limits<int>::max())));
  r.failures = std::max(r.failures, 1);
  // Escaped and cut so that, even with every byte escaped (4 bytes) or
  // replaced as invalid UTF-8 (3), it stays within kMaxHealthDetail.
  r.detail = log_excerpt(detail, rendezvous::kMaxHealthDetail / 5);
  r.retry_in_ms = std::clamp<long long>(retry_in.count(), 0, rendezvous::kMaxTimeoutMs);
  r.check_timeout_ms = std::clamp<long long>(check_timeout.count(), 0, rendezvous::kMaxTimeoutMs);
  health_.report(std::move(r));
}

void RendezvousMember::start() {
  join_pending_ = true;
  rdzv_->connect(settings_.rdzv.join_timeout, [this] { on_connected(); });
  heartbeat_loop();
}

bool RendezvousMember::shutting_down() const { return left_ || core_.stopped_by_signal(); }

bool RendezvousMember::within_stale_connection_window() {
  auto now = MemberClock::now();
  if (!already_exists_since_) already_exists_since_ = now;
  // Twice the window: the server drops the old member at the latest one
  // window after it last heard it, which was before this agent reconnected.
  return now - *already_exists_since_ < settings_.rdzv.dead_after() * 2;
}

// Connected, the first time or again: take the place back or join.
void RendezvousMember::on_connected() {
  if (left_) return;
  reconnecting_ = false;
  last_heard_ = MemberClock::now();
  heard_on_connection_ = false;
  // The lease is not renewed here: a connection proves nothing until the
  // rendezvous answers (an ack, or the assign or resumed that the join sent
  // now brings, which renews it from this send time).
  if (assignment_) return send_resume();
  if (join_pending_) send_join();
  // Otherwise workers are being stopped on an order; rejoin() will join.
}

void RendezvousMember::reconnect() {
  reconnecting_ = true;
  rdzv_->reconnect(settings_.reconnect_timeout, [this] { on_connected(); });
}

// What every join of this node says: who it is, where, with what.
rendezvous::JoinMessage RendezvousMember::join_message() const {
  rendezvous::JoinMessage m;
  m.job = id_.job;
  m.request.node_name = name_;
  m.request.address = id_.address;
  m.request.local_world_size = id_.local_world_size;
  m.request.role = id_.role;
  m.request.store_port = store_port_;
  m.request.is_host = id_.is_host;
  m.request.node_rank = id_.node_rank;
  m.request.launch_order = id_.launch_order;
  m.request.features = {rendezvous::kFeatureStacks, rendezvous::kFeatureExclude};
  m.settings = settings_.rdzv;
  return m;
}

void RendezvousMember::send_join() {
  auto port = events_.round_store();
  if (!port.ok()) return on_error(port.status());
  store_port_ = port.value();
  rendezvous::JoinMessage m = join_message();
  m.request.known_round = known_round_;
  m.request.known_restart_count = known_restart_count_;
  join_pending_ = true;
  last_progress_note_ = join_sent_at_ = MemberClock::now();
  rdzv_->send(rendezvous::to_json(m));
  log::info("[" + id_.role + "] joining the rendezvous of job '" + id_.job + "' at " + rdzv_->address() +
            " as node " + name_);
}

// Back on a new connection while the workers run (or have just ended) under
// an assignment: say where this node stands, so the rendezvous (the same, or
// a restarted one) gives the place back.
void RendezvousMember::send_resume() {
  const auto& a = *assignment_;
  rendezvous::JoinMessage m = join_message();
  rendezvous::Resume r;
  static_cast<rendezvous::Placement&>(r) = a;
  r.outcome = outcome_.value_or(rendezvous::Resume::Outcome::running);
  r.failure = outcome_failure_;
  m.request.resume = r;
  join_sent_at_ = MemberClock::now();
  rdzv_->send(rendezvous::to_json(m));
  log::info("[" + id_.role + "] resuming round " + std::to_string(a.round) + " of job '" + id_.job + "' at " +
            rdzv_->address() + " as group rank " + std::to_string(a.group_rank));
}

void RendezvousMember::heartbeat_loop() {
  auto every = join_pending_ ? std::min(settings_.rdzv.keep_alive_interval, kProgressEvery)
                             : settings_.rdzv.keep_alive_interval;
  heartbeat_timer_.expires_after(every);
  heartbeat_timer_.async_wait([this, every](const boost::system::error_code& ec) {
    if (ec || left_) return;
    // Woken late (the agent was paused): the lease may have lapsed meanwhile,
    // and a heartbeat now must not hide it.
    check_lease();
    if (left_) return;
    // A rendezvous that accepts bytes and never answers (stopped, stuck)
    // would leave a waiting node waiting for ever: its kernel still ACKs.
    auto now = MemberClock::now();
    if (join_pending_ && !assignment_ && rdzv_->connected()) {
      if (now - last_heard_ >= settings_.reconnect_timeout) {
        return on_error(Status(Code::unavailable, silence_text(now - last_heard_) + "; gave up after " +
                                                      seconds_text(settings_.reconnect_timeout) +
                                                      " (--rdzv-conf reconnect_timeout)"));
      }
      // A rendezvous acknowledges every heartbeat: silence past two of them
      // (and the usual few seconds) is said, every few seconds, as any other wait is.
      auto quiet_enough = std::max<std::chrono::steady_clock::duration>(kWaitingNoteEvery, 2 * every);
      if (now - last_heard_ > quiet_enough && now - last_progress_note_ >= kWaitingNoteEvery) {
        last_progress_note_ = now;
        log::warning("[" + id_.role + "] " + silence_text(now - last_heard_) + "; waiting up to " +
                     seconds_text(settings_.reconnect_timeout) + " (--rdzv-conf reconnect_timeout)");
      }
    }
    if (rdzv_->connected()) {
      rendezvous::HeartbeatMessage beat;
      beat.seq = ++heartbeat_seq_;
      beat.progress = join_pending_;
      lease_.sent(*beat.seq, MemberClock::now());
      rdzv_->send(rendezvous::heartbeat_message(beat));
    }
    heartbeat_loop();
  });
}

std::string RendezvousMember::silence_text(std::chrono::steady_clock::duration silent) const {
  std::string text = "the rendezvous at " + rdzv_->address() + " has not answered the join of job '" + id_.job +
                     "' for " + seconds_text(std::chrono::duration_cast<std::chrono::seconds>(silent));
  if (heard_on_connection_) return text;
  // A muster rendezvous answers a join at once (an assignment, or where the
  // round stands): a port that takes the connection and says nothing is
  // most likely held by another program.
  return text + ": something other than a muster rendezvous seems to hold that port (it took the connection "
                "and has said nothing); check --rdzv-endpoint";
}

void RendezvousMember::arm_lease_timer() {
  lease_timer_.expires_at(lease_.expires());
  lease_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || left_) return;
    check_lease();
  });
}

void RendezvousMember::check_lease() {
  if (left_ || !assignment_ || !core_.holds_workers()) return;
  if (!lease_.lapsed(MemberClock::now())) return;
  fence("no heartbeat of this node was acknowledged for " + seconds_text(lease_.dead_after()) +
        " (keep_alive_interval x keep_alive_max_attempt), so the rendezvous counts it gone");
  if (left_) return;
  // That connection has been of no use for the whole window: start afresh.
  if (rdzv_->connected()) reconnect();
}

// The workers run in a world that goes on without them: the agent stops
// them, then rejoins as a newcomer.
void RendezvousMember::fence(const std::string& why) {
  if (shutting_down()) return;
  log::warning("[" + id_.role + "] this node is out of the job: " + log_excerpt(why, 1000) +
               "; stopping its workers, then joining again");
  assignment_.reset();
  outcome_.reset();
  events_.fenced();
}

void RendezvousMember::on_message(const json& raw) {
  if (left_) return;
  auto decoded = rendezvous::server_message_from_json(raw);
  if (!decoded.ok()) {
    return on_error(Status(Code::io_error, "the rendezvous at " + rdzv_->address() +
                                               " sent a message this agent cannot use: " +
                                               decoded.status().message()));
  }
  const auto& m = decoded.value();
  last_heard_ = MemberClock::now();
  heard_on_connection_ = true;
  if (!std::holds_alternative<rendezvous::out::Reject>(m)) already_exists_since_.reset();
  std::visit([this](const auto& message) { handle(message); }, m);
}

void RendezvousMember::handle(const rendezvous::HeartbeatAck& ack) {
  lease_.acked(ack.seq);
  arm_lease_timer();
}

void RendezvousMember::handle(const rendezvous::out::Assign& a) {
  if (shutting_down()) return;
  join_pending_ = false;
  round_ = a.round;
  assignment_ = a;
  // The join that brought this was heard: the lease runs from its sending.
  lease_.renew(join_sent_at_);
  arm_lease_timer();
  outcome_.reset();
  outcome_failure_.reset();
  known_round_ = a.round;
  known_restart_count_ = a.restart_count;
  events_.assigned(a);
}

void RendezvousMember::handle(const rendezvous::out::Resumed& res) {
  lease_.renew(join_sent_at_);
  arm_lease_timer();
  // A warning, as the broken connection was: the reader learns it healed.
  log::warning("[" + id_.role + "] back in round " + std::to_string(res.round) + " of job '" + id_.job + "' at " +
               rdzv_->address() + "; the workers went on running");
}

void RendezvousMember::handle(const rendezvous::out::Waiting& w) {
  auto now = MemberClock::now();
  if (!join_pending_ || now - last_progress_note_ < kWaitingNoteEvery) return;
  last_progress_note_ = now;
  log::warning("[" + id_.role + "] waiting for the rendezvous of job '" + id_.job + "' at " + rdzv_->address() +
               ": round " + std::to_string(w.round) + " has " + std::to_string(w.joined) + " of " +
               std::to_string(w.min_nodes) + ".." + std::to_string(w.max_nodes) + " nodes" +
               (w.waiting > 0 ? " (" + std::to_string(w.waiting) + " more waiting)" : std::string()) + "; " +
               (w.last_call_left
                    ? "it closes in " +
                          seconds_text(std::chrono::duration_cast<std::chrono::seconds>(*w.last_call_left)) +
                          " (last_call_timeout)"
                    : seconds_text(std::chrono::duration_cast<std::chrono::seconds>(w.join_timeout_left)) +
                          " left of join_timeout"));
}

void RendezvousMember::handle(const rendezvous::out::Restart& r) {
  known_round_ = r.next_round;
  if (assignment_ && r.counts_as_failure) known_restart_count_ = assignment_->restart_count + 1;
  assignment_.reset();
  outcome_.reset();
  if (shutting_down()) return;
  log::warning("[" + id_.role + "] the job re-forms (" + log_excerpt(r.reason, 1000) +
               "); will restart worker group");
  events_.restart(r.counts_as_failure);
}

void RendezvousMember::handle(const rendezvous::out::Fenced& fen) {
  if (fen.excluded_for) {
    // A bad node: out of the job, back as a spare once the cooldown ends.
    if (shutting_down()) return;
    exclusion_wait_ = *fen.excluded_for;
    assignment_.reset();
    outcome_.reset();
    // No join until the cooldown is over (not even on a reconnect): the
    // agent's timer joins again (rejoin()).
    join_pending_ = false;
    log::error("[" + id_.role + "] " + log_excerpt(fen.reason, 2000) + "; this node stops its workers and joins again " +
               "as a spare in " + seconds_text(std::chrono::duration_cast<std::chrono::seconds>(*fen.excluded_for)));
    events_.fenced();
    return;
  }
  fence("the rendezvous dropped it (" + fen.reason + ")");
}

void RendezvousMember::handle(const rendezvous::out::Finished& f) {
  if (!f.success && !shutting_down()) {
    log::error("[" + id_.role + "] the job failed: " + log_excerpt(f.message, 1000));
  }
  std::optional<rendezvous::FailureInfo> root_cause;
  if (!f.success && f.root_cause) root_cause = *f.root_cause;
  events_.finish(f.success ? 0 : 1, root_cause);
}

void RendezvousMember::handle(const rendezvous::out::Reject& rej) {
  if (rej.code == Code::already_exists && within_stale_connection_window()) {
    // This node's identity is random: the member holding it is this node's
    // own old connection, which the rendezvous has not seen close yet. It
    // will within the dead-after window; try again shortly until then.
    log::warning("[" + id_.role + "] the rendezvous still holds this node's old connection; reconnecting");
    retry_timer_.expires_after(kStaleConnectionRetry);
    retry_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || left_) return;
      reconnect();
    });
    return;
  }
  refused(rej.message);
}

void RendezvousMember::handle(const rendezvous::ErrorMessage& e) { refused(e.message); }

void RendezvousMember::refused(const std::string& text) {
  on_error(Status(Code::unavailable,
                  "the rendezvous at " + rdzv_->address() + " refused this node: " + log_excerpt(text, 2000)));
}

void RendezvousMember::on_error(const Status& st) {
  if (left_) return;
  if (!reconnecting_) return events_.failed(st);
  events_.failed(Status(st.code(), "lost the rendezvous at " + rdzv_->address() + " and could not reconnect within " +
                                       seconds_text(settings_.reconnect_timeout) +
                                       " (--rdzv-conf reconnect_timeout); the job ends on this node: " + st.message()));
}

// The connection broke: the workers keep running while this node reconnects.
void RendezvousMember::on_lost(const Status& st) {
  if (left_) return;
  // Over: the rendezvous closes the connections of a finished job.
  if (shutting_down() || core_.finishing()) return;
  log::warning("[" + id_.role + "] " + st.message() +
               "; the workers keep running while this node reconnects (for up to " +
               seconds_text(settings_.reconnect_timeout) + ")");
  auto started = MemberClock::now();
  reconnecting_ = true;
  rdzv_->reconnect(settings_.reconnect_timeout, [this, started] {
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(MemberClock::now() - started);
    log::info("[" + id_.role + "] reconnected to the rendezvous at " + rdzv_->address() + " after " + seconds_text(took));
    on_connected();
  });
}

void RendezvousMember::rejoin() {
  if (left_) return;
  assignment_.reset();
  outcome_.reset();
  join_pending_ = true;
  // The rendezvous's silence counts from this join (a node that stepped out
  // heard nothing while it waited for its health check).
  last_heard_ = MemberClock::now();
  if (rdzv_->connected()) send_join();
  // Otherwise the join goes out once the connection is back.
}

void RendezvousMember::report_failure(const rendezvous::FailureInfo& failure) {
  outcome_ = rendezvous::Resume::Outcome::failed;
  outcome_failure_ = failure;
  if (!left_ && rdzv_->connected()) {
    rdzv_->send(rendezvous::to_json(rendezvous::WorkersFailedMessage{round_, failure}));
  }
}

void RendezvousMember::report_hung(int global_rank) {
  // Only to a server whose assignment said it takes them.
  if (left_ || !assignment_ || !rendezvous::has_feature(assignment_->features, rendezvous::kFeatureStacks) ||
      !rdzv_->connected()) {
    return;
  }
  rdzv_->send(rendezvous::to_json(rendezvous::HungMessage{round_, global_rank}));
}

void RendezvousMember::handle(const rendezvous::out::DumpStacks& d) {
  if (shutting_down() || !events_.stacks_requested) return;
  events_.stacks_requested(d.reason);
}

void RendezvousMember::report_success() {
  outcome_ = rendezvous::Resume::Outcome::succeeded;
  // While reconnecting, the resume carries it (a report must not reach a new
  // connection before its join).
  if (!left_ && rdzv_->connected()) rdzv_->send(rendezvous::to_json(rendezvous::WorkersSucceededMessage{round_}));
}

void RendezvousMember::step_out(const std::string& why) {
  if (left_ || shutting_down()) return;
  // A departure: the job re-forms without this node, nothing counted. With
  // the connection down the rendezvous learns it from the resume that finds
  // no assignment, or from the silence.
  if (rdzv_->connected()) rdzv_->send(rendezvous::leave_message());
  fence(why);
}

void RendezvousMember::leave() {
  if (left_) return;
  left_ = true;
  health_.close();
  heartbeat_timer_.cancel();
  lease_timer_.cancel();
  retry_timer_.cancel();
  // Gone at once rather than after the dead-after window (a closed
  // connection alone could still resume); a job already over ignores it.
  if (rdzv_->connected()) rdzv_->send(rendezvous::leave_message());
  rdzv_->close();
}

}  // namespace muster::launcher
