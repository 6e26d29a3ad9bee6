// This node's membership in a multi-node job's rendezvous: joining (and
// joining again after a restart order or a fence), taking its place back
// after a broken connection, heartbeats and the lease they keep, and telling
// the rendezvous how this node's workers ended. It owns the connection and
// decides nothing about workers: each order of the rendezvous becomes an
// event for the agent, which hands it to AgentCore and carries out the
// core's actions.
//
// Contract:
// - start() connects and joins. Each round the rendezvous assigns is
//   events.assigned; the workers run under it.
// - events.restart(counts_as_failure): the job re-forms (counted against
//   --max-restarts when a failure caused it). The agent stops its workers, then
//   calls rejoin().
// - events.finish(code, root cause): the job is over; the root cause is the
//   failure the rendezvous names for a failed job.
// - events.fenced(why): this node is out of the job: the rendezvous dropped
//   it, or no heartbeat was acknowledged for the dead-after window while the
//   workers ran (the lease lapsed). The agent stops its workers, then calls
//   rejoin(); the member joins as a newcomer.
// - events.failed(status): the rendezvous cannot be used any more: it
//   refused this node, sent a message this agent cannot decode, did not
//   answer for reconnect_timeout, or stayed gone past it. The status's
//   message says which, with the rendezvous's address.
// - A broken connection is not an event: the workers keep running while the
//   member reconnects for reconnect_timeout and resumes its place (round,
//   ranks, how the workers ended), or joins afresh if it holds none.
// - report_failure() and report_success() say how the workers ended: sent
//   now, or carried by the resume when the connection is down.
// - leave() ends the membership: the rendezvous hears that this node is gone
//   and no event follows.
// - step_out(why) leaves the job but not the rendezvous (a failed health
//   check): the rendezvous drops this node at once, as for leave(), and the
//   member goes on as if fenced (events.fenced); the agent stops its workers
//   and calls rejoin() when the node may join again, as a newcomer.
// - It reads the agent's core (never changes it): whether workers run under
//   the assignment (only then can the lease fence them) and whether the
//   agent is stopping for good (a signal: orders no longer matter).
//
// Membership, as this node keeps it:
// - Its identity is "<address>_<random 128-bit instance id>", chosen at start.
// - Heartbeats carry a sequence number and are acknowledged; the Lease runs
//   from the send time of the latest acknowledged one.
#pragma once

#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <string>

#include "agent_core.hpp"
#include "health_reporter.hpp"
#include "launch_config.hpp"
#include "muster/common/status.hpp"
#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/client.hpp"
#include "muster/rendezvous/core.hpp"

namespace muster::launcher {

// The member's clock: the steady clock plus an offset that only a test moves
// (advance()), so a test jumps over the member's windows (the lease,
// reconnect_timeout, the notes every few seconds) instead of waiting them out
// in real time on a loaded machine. Its time points are the steady clock's;
// the member's timers wait on it too.
struct MemberClock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::steady_clock::time_point;
  static constexpr bool is_steady = true;
  static time_point now() noexcept;
  // Tests only: every member's clock moves on by d, at once.
  static void advance(duration d) noexcept;
};
using MemberTimer = boost::asio::basic_waitable_timer<MemberClock>;

// What the member follows, from the command line and --rdzv-conf.
struct MemberSettings {
  rendezvous::Settings rdzv;  // sent with every join
  // How long a broken connection is retried before the job ends on this
  // node; never less than the dead-after window.
  rendezvous::Duration reconnect_timeout{60000};
};

// The rendezvous settings of a multi-node job from cfg: --nnodes,
// --max-restarts, the backend (static: every node, with its node rank), and
// --rdzv-conf's keys as the command line resolved them (cfg.rdzv).
MemberSettings member_settings(const LaunchConfig& cfg);

// Who this node is to the rendezvous; the same in every join.
struct MemberIdentity {
  std::string job;                // --rdzv-id
  std::string role;               // --role
  std::string address;            // where the other nodes reach this one
  int local_world_size = 0;       // --nproc-per-node
  std::optional<int> node_rank;   // the static backend's --node-rank
  std::optional<int> launch_order;  // its host's place in a muster --hostfile launch
  bool is_host = false;           // this agent serves the rendezvous (or the static store)
};

class RendezvousMember {
 public:
  struct Events {
    std::function<void(const rendezvous::out::Assign&)> assigned;
    std::function<void(bool counts_as_failure)> restart;
    std::function<void(int exit_code, const std::optional<rendezvous::FailureInfo>& root_cause)> finish;
    std::function<void()> fenced;
    std::function<void(const Status&)> failed;
    // Before each join for a new round: the port of the workers' store this
    // node advertises for it (a fresh store per round, or the static one).
    std::function<Result<int>()> round_store;
    // The rendezvous asks for the workers' Python stacks (a rank of the job
    // was taken for hung, or an operator asked): why, for the log.
    std::function<void(const std::string& reason)> stacks_requested;
  };

  RendezvousMember(boost::asio::io_context& io, std::string host, int port, MemberSettings settings,
                   MemberIdentity identity, std::optional<rendezvous::auth::Key> key, const AgentCore& core,
                   Events events);
  ~RendezvousMember();
  RendezvousMember(const RendezvousMember&) = delete;
  RendezvousMember& operator=(const RendezvousMember&) = delete;

  void start();
  void rejoin();
  void report_failure(const rendezvous::FailureInfo& failure);
  void report_success();
  void leave();
  void step_out(const std::string& why);
  // A worker of this node was taken for hung: the rendezvous has the other
  // nodes take their stacks (only when its assignment said it can).
  void report_hung(int global_rank);
  // This node's health check failed (`failures` so far; `detail`: how, and
  // the end of its output; it tries again in `retry_in`, 0: at once, and
  // that run may take `check_timeout`): the
  // rendezvous hears it on a connection of its own, for musterctl job.
  void report_health(uint64_t failures, const std::string& detail, std::chrono::milliseconds retry_in,
                     std::chrono::milliseconds check_timeout);
  // After an exclusion (a fence with a cooldown): how long to wait before
  // joining again, once; nullopt otherwise.
  std::optional<std::chrono::milliseconds> take_exclusion_wait() { return std::exchange(exclusion_wait_, std::nullopt); }

  bool connected() const { return rdzv_->connected(); }
  // Holds a place in a round the rendezvous counts on.
  bool assigned() const { return assignment_.has_value(); }
  int round() const { return round_; }  // the latest round assigned; -1 before any
  // When the latest join or resume went out (the rendezvous's duration, for events).
  std::chrono::steady_clock::time_point join_sent_at() const { return join_sent_at_; }
  const std::string& address() const { return id_.address; }
  const std::string& name() const { return name_; }
  const MemberSettings& settings() const { return settings_; }

 private:
  void on_connected();
  rendezvous::JoinMessage join_message() const;
  void send_join();
  void send_resume();
  // Decodes a message and hands it to the handle() for its type.
  void on_message(const nlohmann::json& raw);
  void handle(const rendezvous::HeartbeatAck& ack);
  void handle(const rendezvous::out::Assign& a);
  void handle(const rendezvous::out::Resumed& res);
  void handle(const rendezvous::out::Waiting& w);
  void handle(const rendezvous::out::Restart& r);
  void handle(const rendezvous::out::Fenced& fen);
  void handle(const rendezvous::out::DumpStacks& d);
  void handle(const rendezvous::out::Finished& f);
  void handle(const rendezvous::out::Reject& rej);
  void handle(const rendezvous::ErrorMessage& e);
  void refused(const std::string& text);  // the rendezvous turned this node away: the member fails
  void on_error(const Status& st);
  void on_lost(const Status& st);
  void heartbeat_loop();
  void arm_lease_timer();
  void check_lease();
  void fence(const std::string& why);
  void reconnect();
  bool shutting_down() const;
  bool within_stale_connection_window();
  std::optional<std::chrono::milliseconds> exclusion_wait_;

  MemberSettings settings_;
  MemberIdentity id_;
  std::string name_;  // "<address>_<random instance id>"
  const AgentCore& core_;
  Events events_;
  std::shared_ptr<rendezvous::RendezvousClient> rdzv_;
  HealthReporter health_;
  Lease lease_;
  bool left_ = false;
  int round_ = -1;
  int store_port_ = 0;  // advertised with the latest join
  // The assignment the workers run under, while the rendezvous counts on it;
  // with how they ended once they did (sent again when resuming).
  std::optional<rendezvous::out::Assign> assignment_;
  std::optional<rendezvous::Resume::Outcome> outcome_;
  std::optional<rendezvous::FailureInfo> outcome_failure_;
  bool join_pending_ = false;  // a join is due or sent and not yet answered with an assignment
  int known_round_ = 0;        // the round the next join is for, as last heard
  int known_restart_count_ = 0;
  uint64_t heartbeat_seq_ = 0;
  bool reconnecting_ = false;  // the connection broke and has not come back yet
  std::chrono::steady_clock::time_point last_progress_note_{};
  std::chrono::steady_clock::time_point join_sent_at_{};  // the latest join or resume
  std::chrono::steady_clock::time_point last_heard_{};    // the latest message from the rendezvous
  bool heard_on_connection_ = false;  // the current connection has brought a message
  // What a waiting node says when the rendezvous is silent.
  std::string silence_text(std::chrono::steady_clock::duration silent) const;
  std::optional<std::chrono::steady_clock::time_point> already_exists_since_;
  MemberTimer heartbeat_timer_;
  MemberTimer lease_timer_;
  MemberTimer retry_timer_;
};

}  // namespace muster::launcher
