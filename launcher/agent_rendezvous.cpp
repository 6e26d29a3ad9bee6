// The agent in a multi-node job: it joins the job's rendezvous (hosting it
// in-process when the endpoint is one of its own addresses), starts its
// workers on each assignment, reports how they ended, and follows the
// rendezvous's restart, finish and fence orders.
//
// Membership, as this agent keeps it:
// - Its identity is "<address>_<random 128-bit instance id>", chosen at start.
// - Heartbeats carry a sequence number and are acknowledged; the Lease runs
//   from the send time of the latest acknowledged one. When it lapses (the
//   agent was paused, the link is cut, the rendezvous is gone) the workers
//   are stopped at once: the rendezvous has counted, or is about to count,
//   this node gone, and the others re-form without it.
// - A broken connection is not the end: the workers keep running and the
//   agent reconnects for reconnect_timeout, then resumes its place (round,
//   ranks, how its workers ended), or joins afresh if it no longer has one.
#include <sys/random.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "agent.hpp"
#include "exposure.hpp"
#include "muster/common/endpoint.hpp"
#include "muster/common/log.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "rdzv_conf.hpp"
#include "signals.hpp"

namespace muster::launcher {
namespace {

using nlohmann::json;

Result<rendezvous::Duration> conf_seconds(const RdzvConf& conf, const std::string& key, double fallback) {
  auto it = conf.find(key);
  double v = fallback;
  if (it != conf.end()) {
    char* end = nullptr;
    v = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0' || !(v >= 0)) {
      return invalid_argument("The rendezvous configuration option '" + key +
                              "' must be a number of seconds, got '" + it->second + "'");
    }
  }
  // Longer than the protocol's limit (a year) waits as long as that limit.
  constexpr double kMaxMs = static_cast<double>(rendezvous::kMaxTimeoutMs);
  double ms = v * 1000;
  if (!(ms <= kMaxMs)) {
    log::warning("--rdzv-conf " + key + "=" + it->second + " is longer than a year; using a year");
    ms = kMaxMs;
  }
  return rendezvous::Duration(static_cast<long long>(ms));
}

// 128 random bits as hex: no two agents have the same by accident (a PID
// repeats across containers and hosts).
std::string instance_id() {
  unsigned char bytes[16] = {};
  std::size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got < sizeof bytes) {
    // No getrandom (a very old kernel): time and pid, still unique per host.
    auto t = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
    for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(t >> (8 * i));
    auto p = static_cast<unsigned long long>(getpid());
    for (std::size_t i = 0; i < 8; ++i) bytes[8 + i] = static_cast<unsigned char>(p >> (8 * i));
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

}  // namespace

Status Agent::setup_rendezvous() {
  const bool is_static = cfg_.rdzv_backend == "static";
  auto ep = parse_endpoint(cfg_.rdzv_endpoint, is_static ? -1 : 29400);
  if (!ep.ok()) return ep.status();
  const auto& conf = cfg_.rdzv_conf;
  // The static backend waits `timeout` (900 s from torchrun) for every node.
  auto join = is_static ? conf_seconds(conf, "timeout", 900) : conf_seconds(conf, "join_timeout", 600);
  auto last = conf_seconds(conf, "last_call_timeout", 30);
  auto close = conf_seconds(conf, "close_timeout", 30);
  auto keep = conf_seconds(conf, "keep_alive_interval", 5);
  auto attempts = rdzv_conf_int(conf, "keep_alive_max_attempt", 3);
  auto reconnect = conf_seconds(conf, "reconnect_timeout", 60);
  for (const auto* r : {&join, &last, &close, &keep, &reconnect}) {
    if (!r->ok()) return r->status();
  }
  if (!attempts.ok()) return attempts.status();
  if (keep->count() <= 0 || attempts.value() < 1 || attempts.value() > rendezvous::kMaxKeepAliveAttempts) {
    return invalid_argument("keep_alive_interval must be > 0 and keep_alive_max_attempt in [1, " +
                            std::to_string(rendezvous::kMaxKeepAliveAttempts) + "]");
  }
  if (join->count() <= 0) return invalid_argument("join_timeout must be more than 0 seconds");
  rdzv_settings_.min_nodes = cfg_.min_nodes;
  rdzv_settings_.max_nodes = cfg_.max_nodes;
  rdzv_settings_.max_restarts = cfg_.max_restarts;
  rdzv_settings_.join_timeout = join.value();
  rdzv_settings_.last_call_timeout = last.value();
  rdzv_settings_.close_timeout = close.value();
  rdzv_settings_.keep_alive_interval = keep.value();
  rdzv_settings_.keep_alive_max_attempt = static_cast<int>(attempts.value());
  // Reconnecting for less than the dead-after window would give up on a
  // rendezvous that still counts this node alive.
  reconnect_timeout_ = std::max(reconnect.value(), rdzv_settings_.dead_after());
  lease_.emplace(rdzv_settings_.dead_after());

  node_address_ = cfg_.local_addr ? *cfg_.local_addr : host_;
  node_name_ = node_address_ + "_" + instance_id();

  auto from_env = [this](const char* name) { return env_or(env_, name, ""); };
  auto key = rendezvous::auth::find_key(cfg_.auth_key_file, from_env("MUSTER_AUTH_KEY_FILE").c_str(),
                                        from_env("CREDENTIALS_DIRECTORY").c_str());
  if (!key.ok()) return key.status();
  if (key.value()) {
    auth_key_.emplace(key.value()->key);
    log::info("the rendezvous is authenticated with the key from " + key.value()->source);
  }
  // Said once, by the agent that serves the rendezvous to the network.
  auto warn_if_open = [this](const std::string& bind, int port) {
    if (auth_key_ || !beyond_loopback(bind)) return;
    log::warning("the rendezvous of job '" + cfg_.rdzv_id + "' on " + (bind.empty() ? "every interface" : bind) +
                 ", port " + std::to_string(port) +
                 ", authenticates nobody: whoever reaches it can join the job, take its rank 0 or end it; give "
                 "every agent the same --auth-key-file (docs/security.md)");
  };

  if (is_static) {
    // Not elastic: every node of --nnodes's maximum, each with its --node-rank.
    // Node rank 0 serves the workers' store and the rendezvous on --master-port.
    if (ep->port < 0) {
      return invalid_argument("port is missing in endpoint: " + cfg_.rdzv_endpoint + ". Try to specify --master-port");
    }
    if (cfg_.node_rank < 0 || cfg_.node_rank >= cfg_.max_nodes) {
      return invalid_argument("--node-rank=" + std::to_string(cfg_.node_rank) + " is outside [0, " +
                              std::to_string(cfg_.max_nodes) + ") for --nnodes=" + std::to_string(cfg_.max_nodes));
    }
    rdzv_settings_.static_ranks = true;
    rdzv_settings_.min_nodes = rdzv_settings_.max_nodes = cfg_.max_nodes;
    // Node rank 0's port carries the workers' store and the rendezvous: it
    // listens where the other nodes are told to reach it.
    std::string bind = listen_address_for(strip_brackets(ep->host));
    if (cfg_.node_rank == 0) {
      rdzv_server_ = rendezvous::RendezvousServer::create(io_);
      if (auth_key_) rdzv_server_->require_auth(*auth_key_);
      if (auto st = store_host_.serve_shared(bind, ep->port, *rdzv_server_); !st.ok()) {
        return Status(Code::unavailable,
                      "node rank 0 cannot serve --master-port " + std::to_string(ep->port) + ": " + st.message());
      }
      warn_if_open(bind, store_host_.port());
      is_host_ = true;
    } else if (auto st = store_host_.serve(bind, 0); !st.ok()) {
      return Status(Code::unavailable, "cannot serve this node's store: " + st.message());
    }
  }

  // With c10d the workers' store is opened per round, in send_join().

  // Host the rendezvous when the endpoint is ours, as torchrun's c10d backend
  // does; a second agent on the same machine finds the port taken and joins.
  bool ours = is_loopback_name(ep->host) || ep->host == host_ ||
              (cfg_.local_addr && ep->host == *cfg_.local_addr) || is_own_address(ep->host);
  auto forced = rdzv_conf_bool(conf, "is_host", ours);
  if (!forced.ok()) return forced.status();
  bool explicit_host = conf.count("is_host") > 0;
  if (!is_static && forced.value()) {
    std::string bind = ep->host == "localhost" ? "127.0.0.1" : listen_address_for(strip_brackets(ep->host));
    auto server = rendezvous::RendezvousServer::listen(io_, bind, ep->port);
    if (server.ok()) {
      rdzv_server_ = std::move(server.value());
      if (auth_key_) rdzv_server_->require_auth(*auth_key_);
      warn_if_open(bind, rdzv_server_->port());
      is_host_ = true;
      log::info("hosting the rendezvous of job '" + cfg_.rdzv_id + "' on " + ep->to_string());
    } else if (explicit_host) {
      return Status(Code::unavailable, "is_host=true, but " + server.status().message());
    }
  }
  std::string connect_host = ep->host;
  rdzv_ = std::make_shared<rendezvous::RendezvousClient>(
      io_, connect_host, ep->port, [this](const json& m) { on_rendezvous_message(m); },
      [this](const Status& st) { on_rendezvous_error(st); }, [this](const Status& st) { on_rendezvous_lost(st); });
  // Heartbeats nobody acknowledges (the link is cut, the server's host
  // vanished) make the kernel fail the connection after twice the window.
  rdzv_->set_user_timeout(rdzv_settings_.dead_after() * 2);
  if (auth_key_) rdzv_->set_auth_key(*auth_key_);
  return planner_.resolve_executable(env_);
}

int Agent::run_coordinated() {
  coordinated_ = true;
  if (auto st = setup_rendezvous(); !st.ok()) {
    std::string msg = "muster: error: " + st.message() + "\n";
    say(msg);
    if (events_) emit_event("FAILED", "AGENT", nullptr, st.message(), std::nullopt);
    return 1;
  }
  io_.poll();  // a signal during start-up ends the run before anything starts
  if (finished_) return exit_code_;
  join_pending_ = true;
  rdzv_->connect(rdzv_settings_.join_timeout, [this] { on_connected(); });
  heartbeat_loop();
  io_.run();
  return exit_code_;
}

bool Agent::within_stale_connection_window() {
  auto now = std::chrono::steady_clock::now();
  if (!already_exists_since_) already_exists_since_ = now;
  // Twice the window: the server drops the old member at the latest one
  // window after it last heard it, which was before this agent reconnected.
  return now - *already_exists_since_ < rdzv_settings_.dead_after() * 2;
}

bool Agent::shutting_down() const { return finished_ || core_.stop_reason() == StopReason::signal; }

// Connected, the first time or again: take the place back or join.
void Agent::on_connected() {
  if (finished_) return;
  reconnecting_ = false;
  last_heard_ = std::chrono::steady_clock::now();
  // The lease is not renewed here: a connection proves nothing until the
  // rendezvous answers (an ack, or the assign or resumed that the join sent
  // now brings, which renews it from this send time).
  if (assignment_) return send_resume();
  if (join_pending_) send_join();
  // Otherwise workers are being stopped on an order; Rejoin will join.
}

// What every join of this node says: who it is, where, with what.
rendezvous::JoinMessage Agent::join_message() const {
  rendezvous::JoinMessage m;
  m.job = cfg_.rdzv_id;
  m.request.node_name = node_name_;
  m.request.address = node_address_;
  m.request.local_world_size = cfg_.nproc_per_node;
  m.request.role = cfg_.role;
  m.request.store_port = store_host_.port();
  m.request.is_host = is_host_;
  if (rdzv_settings_.static_ranks) m.request.node_rank = cfg_.node_rank;
  m.settings = rdzv_settings_;
  return m;
}

void Agent::send_join() {
  // Each round gets a store of its own, advertised with this join: workers of
  // the round that ended cannot write into it, and nobody resets it under the
  // new round's workers. The static backend's store stays on --master-port and
  // keeps its keys, as torchrun's does: emptying it could cut off the other
  // nodes' rendezvous connections that share its port.
  if (!rdzv_settings_.static_ranks) {
    if (auto st = store_host_.new_round(listen_address_for(node_address_)); !st.ok()) {
      return on_rendezvous_error(st);
    }
  }
  rendezvous::JoinMessage m = join_message();
  m.request.known_round = known_round_;
  m.request.known_restart_count = known_restart_count_;
  join_pending_ = true;
  last_progress_note_ = join_sent_at_ = std::chrono::steady_clock::now();
  rdzv_->send(rendezvous::to_json(m));
  log::info("[" + cfg_.role + "] joining the rendezvous of job '" + cfg_.rdzv_id + "' at " + rdzv_->address() +
            " as node " + node_name_);
}

// Back on a new connection while the workers run (or have just ended) under
// an assignment: say where this node stands, so the rendezvous (the same, or
// a restarted one) gives the place back.
void Agent::send_resume() {
  const auto& a = *assignment_;
  rendezvous::JoinMessage m = join_message();
  rendezvous::Resume r;
  r.round = a.round;
  r.restart_count = a.restart_count;
  r.group_rank = a.group_rank;
  r.group_world_size = a.group_world_size;
  r.ranks = a.ranks;
  r.master_addr = a.master_addr;
  r.master_port = a.master_port;
  r.outcome = outcome_.value_or(rendezvous::Resume::Outcome::running);
  r.failure = outcome_failure_;
  m.request.resume = r;
  join_sent_at_ = std::chrono::steady_clock::now();
  rdzv_->send(rendezvous::to_json(m));
  log::info("[" + cfg_.role + "] resuming round " + std::to_string(a.round) + " of job '" + cfg_.rdzv_id + "' at " +
            rdzv_->address() + " as group rank " + std::to_string(a.group_rank));
}

void Agent::heartbeat_loop() {
  // While waiting for a round the heartbeats also ask where it stands, at
  // least every few seconds, so the wait can say what it waits for.
  constexpr rendezvous::Duration kProgressEvery{5000};
  auto every = join_pending_ ? std::min(rdzv_settings_.keep_alive_interval, kProgressEvery)
                             : rdzv_settings_.keep_alive_interval;
  heartbeat_timer_.expires_after(every);
  heartbeat_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || finished_) return;
    // Woken late (the agent was paused): the lease may have lapsed meanwhile,
    // and a heartbeat now must not hide it.
    check_lease();
    if (finished_) return;
    // A rendezvous that accepts bytes and never answers (stopped, stuck)
    // would leave a waiting node waiting for ever: its kernel still ACKs.
    if (join_pending_ && !assignment_ && rdzv_->connected() &&
        std::chrono::steady_clock::now() - last_heard_ >= reconnect_timeout_) {
      return on_rendezvous_error(Status(Code::unavailable, "the rendezvous at " + rdzv_->address() +
                                                               " has not answered for " +
                                                               seconds_of(reconnect_timeout_) +
                                                               " (--rdzv-conf reconnect_timeout)"));
    }
    if (rdzv_->connected()) {
      rendezvous::HeartbeatMessage beat;
      beat.seq = ++heartbeat_seq_;
      beat.progress = join_pending_;
      lease_->sent(*beat.seq, std::chrono::steady_clock::now());
      rdzv_->send(rendezvous::heartbeat_message(beat));
    }
    heartbeat_loop();
  });
}

void Agent::arm_lease_timer() {
  lease_timer_.expires_at(lease_->expires());
  lease_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || finished_) return;
    check_lease();
  });
}

void Agent::check_lease() {
  if (finished_ || !assignment_ || !core_.holds_workers()) return;
  if (!lease_->lapsed(std::chrono::steady_clock::now())) return;
  fence("no heartbeat of this node was acknowledged for " + seconds_of(lease_->dead_after()) +
        " (keep_alive_interval x keep_alive_max_attempt), so the rendezvous counts it gone");
  // That connection has been of no use for the whole window: start afresh.
  if (rdzv_->connected()) {
    reconnecting_ = true;
    rdzv_->reconnect(reconnect_timeout_, [this] { on_connected(); });
  }
}

// The workers run in a world that goes on without them: stop them, then join
// as a newcomer.
void Agent::fence(const std::string& why) {
  if (shutting_down()) return;
  log::warning("[" + cfg_.role + "] this node is out of the job: " + rendezvous::log_excerpt(why, 1000) +
               "; stopping its workers, then joining again");
  assignment_.reset();
  outcome_.reset();
  apply(core_.on_fenced());
}

void Agent::on_rendezvous_message(const json& raw) {
  if (finished_) return;
  auto decoded = rendezvous::server_message_from_json(raw);
  if (!decoded.ok()) {
    return on_rendezvous_error(Status(Code::io_error, "the rendezvous at " + rdzv_->address() +
                                                          " sent a message this agent cannot use: " +
                                                          decoded.status().message()));
  }
  const auto& m = decoded.value();
  last_heard_ = std::chrono::steady_clock::now();
  if (!std::holds_alternative<rendezvous::out::Reject>(m)) already_exists_since_.reset();
  if (const auto* ack = std::get_if<rendezvous::HeartbeatAck>(&m)) {
    lease_->acked(ack->seq);
    arm_lease_timer();
  } else if (const auto* a = std::get_if<rendezvous::out::Assign>(&m)) {
    if (shutting_down()) return;
    join_pending_ = false;
    round_ = a->round;
    assignment_ = *a;
    // The join that brought this was heard: the lease runs from its sending.
    lease_->renew(join_sent_at_);
    arm_lease_timer();
    outcome_.reset();
    outcome_failure_.reset();
    known_round_ = a->round;
    known_restart_count_ = a->restart_count;
    group_.role = cfg_.role;
    group_.group_rank = a->group_rank;
    group_.group_world_size = a->group_world_size;
    group_.local_world_size = cfg_.nproc_per_node;
    group_.base_global_rank = a->ranks.base_global_rank;
    group_.global_world_size = a->ranks.global_world_size;
    group_.base_role_rank = a->ranks.base_role_rank;
    group_.role_world_size = a->ranks.role_world_size;
    group_.master_addr = a->master_addr;
    group_.master_port = a->master_port;
    group_.use_agent_store = true;
    group_.run_id = cfg_.rdzv_id;
    group_.max_restarts = cfg_.max_restarts;
    log::info("[" + cfg_.role + "] Rendezvous complete for workers. Result:\n  restart_count=" +
              std::to_string(a->restart_count) + "\n  master_addr=" + group_.master_addr +
              "\n  master_port=" + std::to_string(group_.master_port) + "\n  group_rank=" +
              std::to_string(group_.group_rank) + "\n  group_world_size=" + std::to_string(group_.group_world_size));
    apply(core_.on_assignment(a->restart_count));
  } else if (const auto* res = std::get_if<rendezvous::out::Resumed>(&m)) {
    lease_->renew(join_sent_at_);
    arm_lease_timer();
    // A warning, as the broken connection was: the reader learns it healed.
    log::warning("[" + cfg_.role + "] back in round " + std::to_string(res->round) + " of job '" + cfg_.rdzv_id +
                 "' at " + rdzv_->address() + "; the workers went on running");
  } else if (const auto* w = std::get_if<rendezvous::out::Waiting>(&m)) {
    auto now = std::chrono::steady_clock::now();
    if (!join_pending_ || now - last_progress_note_ < std::chrono::seconds(5)) return;
    last_progress_note_ = now;
    log::warning("[" + cfg_.role + "] waiting for the rendezvous of job '" + cfg_.rdzv_id + "' at " +
                 rdzv_->address() + ": round " + std::to_string(w->round) + " has " + std::to_string(w->joined) +
                 " of " + std::to_string(w->min_nodes) + ".." + std::to_string(w->max_nodes) + " nodes" +
                 (w->waiting > 0 ? " (" + std::to_string(w->waiting) + " more waiting)" : std::string()) + "; " +
                 seconds_of(std::chrono::duration_cast<std::chrono::seconds>(w->join_timeout_left)) +
                 " left of join_timeout");
  } else if (const auto* r = std::get_if<rendezvous::out::Restart>(&m)) {
    known_round_ = r->next_round;
    if (assignment_ && r->counts_as_failure) known_restart_count_ = assignment_->restart_count + 1;
    assignment_.reset();
    outcome_.reset();
    if (shutting_down()) return;
    log::warning("[" + cfg_.role + "] the job re-forms (" + rendezvous::log_excerpt(r->reason, 1000) +
                 "); will restart worker group");
    apply(core_.on_restart_order());
  } else if (const auto* fen = std::get_if<rendezvous::out::Fenced>(&m)) {
    fence("the rendezvous dropped it (" + fen->reason + ")");
  } else if (const auto* f = std::get_if<rendezvous::out::Finished>(&m)) {
    if (!f->success && f->root_cause) job_root_cause_ = *f->root_cause;
    if (!f->success && !shutting_down()) {
      log::error("[" + cfg_.role + "] the job failed: " + rendezvous::log_excerpt(f->message, 1000));
    }
    apply(core_.on_finish_order(f->success ? 0 : 1));
  } else if (const auto* rej = std::get_if<rendezvous::out::Reject>(&m);
             rej && rej->code == Code::already_exists && within_stale_connection_window()) {
    // This agent's identity is random: the member holding it is this agent's
    // own old connection, which the rendezvous has not seen close yet. It
    // will within the dead-after window; try again shortly until then.
    log::warning("[" + cfg_.role + "] the rendezvous still holds this node's old connection; reconnecting");
    retry_timer_.expires_after(std::chrono::milliseconds(500));
    retry_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || finished_) return;
      reconnecting_ = true;
      rdzv_->reconnect(reconnect_timeout_, [this] { on_connected(); });
    });
  } else {
    const std::string& text = std::holds_alternative<rendezvous::out::Reject>(m)
                                  ? std::get<rendezvous::out::Reject>(m).message
                                  : std::get<rendezvous::ErrorMessage>(m).message;
    on_rendezvous_error(Status(Code::unavailable, "the rendezvous at " + rdzv_->address() +
                                                      " refused this node: " + rendezvous::log_excerpt(text, 2000)));
  }
}

void Agent::on_rendezvous_error(const Status& st) {
  if (finished_) return;
  if (!shutting_down()) {
    std::string msg = "muster: error: " +
                      (reconnecting_ ? "lost the rendezvous at " + rdzv_->address() +
                                           " and could not reconnect within " + seconds_of(reconnect_timeout_) +
                                           " (--rdzv-conf reconnect_timeout); the job ends on this node: " +
                                           st.message()
                                     : st.message()) +
                      "\n";
    say(msg);
  }
  apply(core_.on_rendezvous_lost());
  // Not coordinated yet or nothing running: the order has nothing to stop.
  if (!finished_ && !core_.holds_workers()) apply(core_.on_finish_order(1));
}

// The connection broke: keep the workers, reconnect for reconnect_timeout.
void Agent::on_rendezvous_lost(const Status& st) {
  if (finished_) return;
  // Over: the rendezvous closes the connections of a finished job.
  if (shutting_down() || core_.finishing()) return;
  log::warning("[" + cfg_.role + "] " + st.message() + "; the workers keep running while this node reconnects (for up to " +
               seconds_of(reconnect_timeout_) + ")");
  auto started = std::chrono::steady_clock::now();
  reconnecting_ = true;
  rdzv_->reconnect(reconnect_timeout_, [this, started] {
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    log::info("[" + cfg_.role + "] reconnected to the rendezvous at " + rdzv_->address() + " after " +
              seconds_of(took));
    on_connected();
  });
}

void Agent::report_to_rendezvous_failure(int local_rank) {
  auto f = reporter_.rendezvous_failure(local_rank, node_address_);
  outcome_ = rendezvous::Resume::Outcome::failed;
  outcome_failure_ = f;
  if (rdzv_->connected()) rdzv_->send(rendezvous::to_json(rendezvous::WorkersFailedMessage{round_, f}));
}

}  // namespace muster::launcher
