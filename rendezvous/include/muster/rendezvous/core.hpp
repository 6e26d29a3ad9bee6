// The rendezvous of one job as a state machine without I/O. Agents (members)
// join, heartbeat and report how their workers ended; the core answers with
// what each member must be told. Time is passed in, so every timeout can be
// tested with a fake clock. The same core serves musterd (many jobs) and an
// agent that hosts its job's rendezvous.
//
// Rounds: a round collects joiners; it completes when max_nodes have joined,
// or when at least min_nodes have and last_call_timeout has passed since the
// last join. Completing assigns node ranks (explicit ones for the static
// backend; else the hosting node first, then by address and name), global and
// role ranks from each node's local world size, and MASTER_ADDR/MASTER_PORT
// from node rank 0. A running round ends when a member dies (silent for
// keep_alive_interval x keep_alive_max_attempt), when a member's workers fail
// (a failure restart, counted job-wide against max_restarts), when a node
// waits to join below max_nodes (a membership restart, not counted), or when
// every member's workers succeeded (the job is done). A failure with no
// restarts left closes the job: every other member is told who failed first.
//
// Membership is one truth, held here:
// - A member is its node name, which carries the agent's random instance id
//   (an identity no other agent has by accident). A join under a name whose
//   member is still connected is refused, never a silent replacement.
// - A broken connection is not a departure: the member stays, silent, until
//   the dead-after window passes, and a reconnect under its name takes its
//   place back (resume) with its round, ranks and workers untouched.
// - A connection its member's side closed cleanly without `leave` (the agent
//   was killed; its kernel closed the socket) is a loss decided fast: the
//   member is lost once kLossGrace passes without it reconnecting. A reset or
//   a timeout counts as silence (the dead-after window), and a close the
//   server made itself never counts as the member's.
// - A loss is a membership change, not a failure: the round re-forms without
//   a restart counted. A worker failure reported while another member of the
//   round is unreachable (its connection down, or its heartbeat overdue) is
//   held: until that member is back (then it is a failure, as any other) or
//   lost (then it is the loss's consequence, not counted; the restart names
//   the lost node and the failure that followed).
// - Bad nodes are excluded (Settings::exclude_after, a failure that asks for
//   it): the node that was the root cause of exclude_after failed attempts in
//   a row (the earliest failure of an attempt, by when it happened, not by
//   when its report arrived: the verdict waits until every node of the
//   attempt reported or joined again, at most kVerdictSettle), or whose
//   worker asked, is told it is excluded
//   (a fence with a cooldown) and leaves the job, which re-forms without it.
//   Never where that would end the job: fewer than min_nodes would remain,
//   the node hosts the rendezvous, or ranks are static. Keyed by address: a
//   join from an excluded address waits (parked) until its cooldown ends,
//   whatever agent sends it. The cooldown doubles with each exclusion. Back
//   after it, the node is a spare: it does not make a running round re-form.
// - Only a `leave`, a loss, silence or an exclusion removes a member.
// - A member removed for silence is fenced: told so whenever it can still be
//   reached (now, or when it comes back), so it stops its workers and joins
//   again as a newcomer.
// - A core created from nothing (a restarted musterd) rebuilds a running round
//   from the members that resume it, keeping its round and restart count;
//   members that do not come back within the dead-after window make the round
//   re-form.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "muster/common/status.hpp"
#include "muster/rendezvous/rank_assignment.hpp"

namespace muster::rendezvous {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Duration = std::chrono::milliseconds;
using MemberId = uint64_t;

// t + d, held at the clock's end instead of wrapping around.
inline TimePoint saturating_add(TimePoint t, Duration d) {
  using Ns = Clock::duration;
  if (d.count() <= 0) return t;
  constexpr auto kMaxMs = std::chrono::duration_cast<Duration>(Ns::max()).count();
  if (d.count() >= kMaxMs) return TimePoint::max();
  auto dn = std::chrono::duration_cast<Ns>(d);
  if (t.time_since_epoch().count() > 0 && dn > TimePoint::max() - t) return TimePoint::max();
  return t + dn;
}

// How long a member whose side closed its connection without `leave` has to
// reconnect before it is lost: longer than an agent's own reconnect takes
// (back-off, connect, handshake), far shorter than the dead-after window.
constexpr Duration kLossGrace{5000};

// What an agent can do beyond the protocol's first version, said in its join
// (JoinRequest::features), and what a server can, said in its assignments:
// a message a peer did not say it understands is never sent to it.
// "stacks": the agent takes its workers' Python stacks on a `dump_stacks`
// order; the server takes `hung` reports and `stacks` queries.
inline constexpr const char* kFeatureStacks = "stacks";
// "exclude": the agent waits out an exclusion's cooldown itself (a fence with
// excluded_for) and joins again after it; a join it sends meanwhile (one in
// flight, a reconnect) is parked without being taken in by the cooldown's end.
inline constexpr const char* kFeatureExclude = "exclude";
constexpr std::size_t kMaxFeatures = 16;
inline bool has_feature(const std::vector<std::string>& features, const char* feature) {
  for (const auto& f : features) {
    if (f == feature) return true;
  }
  return false;
}
constexpr std::size_t kMaxFeatureLength = 64;

// An excluded node's cooldown doubles with each exclusion of its address, up to this.
constexpr Duration kMaxExcludeCooldown = std::chrono::hours(1);
// How long the verdict on a failed attempt (whose failure came first) waits
// for the reports of the attempt's other nodes: it is given once each of them
// reported or joined again, or after this.
constexpr Duration kVerdictSettle{5000};
// Addresses the core remembers exclusions of; past it, expired ones are forgotten.
constexpr std::size_t kMaxExclusions = 4096;

// How a member's connection ended, as the server saw it.
enum class Disconnect {
  broken,          // a reset, a timeout, an error, or a close the server made: silence decides
  closed_by_peer,  // a clean end of stream from the member's side, without leave: lost after kLossGrace
};

struct Settings {
  int min_nodes = 1;
  int max_nodes = 1;
  int max_restarts = 0;
  Duration join_timeout = std::chrono::seconds(600);
  Duration last_call_timeout = std::chrono::seconds(30);
  Duration close_timeout = std::chrono::seconds(30);
  Duration keep_alive_interval = std::chrono::seconds(5);
  int keep_alive_max_attempt = 3;
  bool static_ranks = false;  // the static backend: members bring their node rank
  // A node that was the root cause of this many failed attempts in a row is
  // excluded (0: never); the first exclusion lasts exclude_cooldown.
  int exclude_after = 0;
  Duration exclude_cooldown = std::chrono::seconds(60);

  Duration dead_after() const { return keep_alive_interval * keep_alive_max_attempt; }
};

// What a node that joins a closed job is told (by the job, or by the
// rendezvous that remembers how it ended).
std::string closed_job_text(bool succeeded);

// A node rank that belongs to one node before it joins (Rendezvous::reserve_node_rank).
struct ReservedRank {
  int node_rank = 0;
  std::string node_name;
};

// How a member's workers failed: what the job-wide report needs.
struct FailureInfo {
  int global_rank = 0;
  int local_rank = 0;
  int exitcode = 0;  // negative: signal
  std::string host;
  std::string message;
  long long timestamp = 0;
  int pid = 0;  // 0: not known (an agent older than this field)
  // When its agent saw the worker end (Unix time, milliseconds; 0: not
  // known): orders the failures of one attempt finer than `timestamp`.
  long long failed_at_ms = 0;
  // The worker asked for its node to be excluded (--exclude-exit-code).
  bool exclude_node = false;
};
// When a failure happened, as finely as its report says.
inline long long failure_time_ms(const FailureInfo& f) {
  return f.failed_at_ms > 0 ? f.failed_at_ms : f.timestamp * 1000;
}

// A member that held a place in a running round when its connection broke
// says so when it reconnects: the round, its place in it (as assigned), and
// how its workers are doing.
// Where a member stands in a round: what an assignment gives it and what a
// resume hands back (encoded and decoded once, protocol.cpp).
struct Placement {
  int round = 0;
  int restart_count = 0;  // failure restarts so far, the same on every node
  int group_rank = 0;
  int group_world_size = 1;
  NodeRanks ranks;
  std::string master_addr;
  int master_port = 0;
};

struct Resume : Placement {
  enum class Outcome { running, succeeded, failed };
  Outcome outcome = Outcome::running;
  std::optional<FailureInfo> failure;  // outcome failed
};

struct JoinRequest {
  std::string node_name;  // unique per agent: "<host>_<random instance id>"
  std::string address;    // what workers of other nodes use to reach this one
  int local_world_size = 1;
  std::string role = "default";
  int store_port = 0;               // the workers' store this node would serve as node rank 0
  std::optional<int> node_rank;     // static backend only
  // The node's place in the list of hosts a launching command started (muster
  // --hostfile): nodes with one come first, in that order, ahead of the usual
  // order (the host first, then by address).
  std::optional<int> launch_order;
  bool is_host = false;             // the agent that hosts the rendezvous
  std::vector<std::string> features;  // what the agent can do (kFeatureStacks)
  // What the agent knows of the job's history, for a core that lost it (a
  // restarted musterd): the round it joins for and the restart count that
  // round will have. Ignored once the core has a history of its own.
  int known_round = 0;
  int known_restart_count = 0;
  std::optional<Resume> resume;
};

namespace out {
// The round is complete: this member's place in it.
struct Assign : Placement {
  MemberId member = 0;
  std::vector<std::string> features;  // what the server can do (kFeatureStacks)
};
// Stop the workers and join again for the next round.
struct Restart {
  MemberId member = 0;
  int next_round = 0;
  bool counts_as_failure = false;
  std::string reason;
};
// The join cannot be served (closed job, timeout, bad request).
struct Reject {
  MemberId member = 0;
  Code code = Code::invalid_argument;
  std::string message;
};
// The job is over for this member: success, or failure with the root cause.
struct Finished {
  MemberId member = 0;
  bool success = false;
  std::optional<FailureInfo> root_cause;
  std::string message;
};
// The rendezvous dropped this member (it was silent too long, or it came back
// to a round it is no longer part of): stop the workers, join as a newcomer.
struct Fenced {
  MemberId member = 0;
  std::string reason;
  // Excluded (a bad node): how long before the rendezvous takes it back. An
  // agent that does not know the field joins again at once and is parked.
  std::optional<Duration> excluded_for;
};
// A member that reconnected has its place back; its workers go on.
struct Resumed {
  MemberId member = 0;
  int round = 0;
};
// Where the round that a waiting member waits for stands.
struct Waiting {
  MemberId member = 0;
  int round = 0;
  int joined = 0;   // members of the forming round
  int waiting = 0;  // newcomers waiting for a running round to re-form
  int min_nodes = 0;
  int max_nodes = 0;
  Duration join_timeout_left{0};
  // The round has its minimum and closes when last_call_timeout has passed:
  // that is what the member waits for then, not join_timeout.
  std::optional<Duration> last_call_left;
};
// Take the Python stacks of this member's workers and log them (only to a
// member whose join listed kFeatureStacks).
struct DumpStacks {
  MemberId member = 0;
  std::string reason;
};
// A line for the rendezvous host's log (member 0: delivered to nobody).
struct Log {
  MemberId member = 0;
  bool warning = false;
  std::string text;
};
}  // namespace out

using Output = std::variant<out::Assign, out::Restart, out::Reject, out::Finished, out::Fenced, out::Resumed,
                            out::Waiting, out::DumpStacks, out::Log>;

enum class State { forming, running, closed };
const char* state_name(State s);

// What an operator asks about a job (musterctl): a snapshot, no I/O.
struct MemberView {
  std::string node_name;
  std::string address;
  std::string role;
  int local_world_size = 0;
  std::optional<int> group_rank;  // in the running round
  bool in_round = false;          // joined the current round
  bool waiting = false;           // joined while a round runs
  bool connected = true;
  Duration since_heard{0};
  std::optional<Duration> parked_for;  // excluded: joined, taken in once its cooldown ends
};
// A node excluded from the job (by address), and until when.
struct ExclusionView {
  std::string address;
  std::string node_name;
  std::string why;
  int count = 0;       // exclusions of this address so far
  Duration left{0};    // of the current cooldown (0: over)
};
struct JobView {
  State state = State::forming;
  int round = 0;
  int restart_count = 0;
  Settings settings;
  std::size_t in_round = 0;  // members of the current (or forming) round
  std::size_t total_members = 0;
  // Members in order (by group rank, then by name): the slice asked for.
  std::vector<MemberView> members;
  // The latest failure a member reported (with or without a restart).
  std::optional<FailureInfo> last_failure;
  std::string last_failure_node;
  std::optional<Duration> since_last_failure;
  std::vector<ExclusionView> exclusions;  // by address
};

// What a job has done so far, for metrics; the server adds up its jobs'.
struct Counters {
  uint64_t rounds = 0;            // rounds completed
  uint64_t restarts = 0;          // rounds ended by a failure (with a restart left)
  uint64_t failures = 0;          // workers_failed reports acted on
  uint64_t lost_to_silence = 0;   // members dropped after the dead-after window
  uint64_t lost_to_close = 0;     // members lost after closing their connection without leave
  uint64_t failures_held = 0;     // failures held while another member was unreachable
  uint64_t left = 0;              // members that said leave
  uint64_t excluded = 0;          // nodes excluded (exclude_after, --exclude-exit-code)
  Counters& operator+=(const Counters& o) {
    excluded += o.excluded;
    rounds += o.rounds;
    restarts += o.restarts;
    failures += o.failures;
    lost_to_silence += o.lost_to_silence;
    lost_to_close += o.lost_to_close;
    failures_held += o.failures_held;
    left += o.left;
    return *this;
  }
};

class Rendezvous {
 public:
  explicit Rendezvous(Settings settings);

  // The static backend's node rank 0 serves the rendezvous and is a member of
  // it: `node_rank` belongs to `node_name` from the start, so another node
  // claiming it is turned away whichever of the two joins first. Only a job
  // with static ranks reads it.
  void reserve_node_rank(ReservedRank reserved) { reserved_ = std::move(reserved); }

  std::vector<Output> join(MemberId member, const JoinRequest& request, TimePoint now);
  // Whether a node that asks for `asked` may join this job (`job`: its id, for
  // the message): every node of a job gives the same --nnodes and backend.
  Status accepts_settings(const std::string& job, const Settings& asked) const;
  // A heartbeat; a held failure that no longer waits for anyone is acted on.
  std::vector<Output> heartbeat(MemberId member, TimePoint now);
  // Where the round stands, for a member waiting for one (nullopt otherwise).
  std::optional<out::Waiting> progress(MemberId member, TimePoint now) const;
  // Reports about a round other than the running one are ignored: they come
  // from workers that were being stopped anyway.
  std::vector<Output> workers_failed(MemberId member, int round, const FailureInfo& failure, TimePoint now);
  std::vector<Output> workers_succeeded(MemberId member, int round, TimePoint now);
  // A worker of `member` (global rank `global_rank`) was taken for hung in
  // `round`: every other member of the running round that can takes its
  // workers' stacks now, while the hung collective's peers still wait in it.
  // Once per round: the first hung report of a round asks the others.
  std::vector<Output> worker_hung(MemberId member, int round, int global_rank, TimePoint now);
  // An operator asks for the stacks of every worker of the running round
  // (musterctl stacks): orders for the members that can; `unable` counts the
  // others.
  std::vector<Output> request_stacks(const std::string& who, std::size_t& unable);
  // A member that says goodbye: it is gone at once.
  std::vector<Output> leave(MemberId member, TimePoint now);
  // A member's connection ended. Broken: it keeps its place until it is
  // silent for the dead-after window, so it can reconnect and resume. Closed
  // by its side: lost unless it is back within kLossGrace.
  void disconnected(MemberId member, TimePoint now, Disconnect how = Disconnect::broken);
  // Fires what is due at `now`: last call, join timeouts, dead members.
  std::vector<Output> tick(TimePoint now);
  // The driver fell behind: for `lag` it could not read what members sent
  // (its loop was starved, or busy with a storm of joins). That silence is
  // not theirs: each member's is counted from later, by at most the
  // dead-after window between two messages of its own, so a driver that
  // stays behind still finds the dead.
  void forgive(Duration lag, TimePoint now);
  // When tick() next has something to do (O(members)).
  std::optional<TimePoint> next_deadline() const;
  // No event at `now` can make anything due before now + shortest_timeout():
  // a driver can skip re-arming its timer when one is set earlier.
  Duration shortest_timeout() const;

  // The job as an operator sees it, with members [from, from + limit) of the
  // ordered list: O(members + limit log limit), so paging through a large
  // job does not sort it once per page.
  JobView view(TimePoint now, std::size_t from = 0, std::size_t limit = SIZE_MAX) const;
  const Counters& counters() const { return counters_; }
  State state() const { return state_; }
  int round() const { return round_; }
  int restart_count() const { return restart_count_; }
  std::size_t participants() const { return participants_.size(); }
  std::size_t waiting() const { return waiting_.size(); }
  std::size_t members() const { return members_.size(); }
  bool succeeded() const { return succeeded_; }
  bool recovering() const { return recovering_; }

 private:
  struct Member {
    JoinRequest request;
    TimePoint last_seen;
    TimePoint join_deadline;
    bool done = false;
    bool connected = true;
    std::optional<TimePoint> closed_at;  // its side closed the connection without leave
    std::optional<TimePoint> parked_until;  // joined from an excluded address: taken in then
    // Excluded itself: it stays a member (so it hears how the job ends) but
    // is taken in only by the join its agent sends after the cooldown.
    bool awaiting_join = false;
    Duration forgiven{0};  // silence forgiven since it was last heard (forgive())
  };
  struct Exclusion {
    std::string node_name;
    std::string why;
    TimePoint until{};
    int count = 0;
  };
  // A failure reported for a round, kept until another round fails.
  struct RoundFailure {
    std::string node_name;
    std::string address;
    FailureInfo failure;
  };
  struct Verdict {
    MemberId member = 0;
    std::string why;
  };
  // A failure reported while another member of the round was unreachable.
  struct HeldFailure {
    MemberId member = 0;
    int round = 0;
    FailureInfo failure;
    std::string unreachable;  // the member it waits for, by name
  };

  void complete_round(std::vector<Output>& out);
  // The rest of a join: into the forming round, or waiting for the next one.
  void admit(MemberId member, TimePoint now, std::vector<Output>& out);
  void record_failure(MemberId member, int round, const FailureInfo& failure);
  // The failure of failures_round_ that happened first (one that asks for
  // its node's exclusion comes before any other); null when none.
  const RoundFailure* root_failure() const;
  // Decides the root cause of failures_round_: its node's streak grows, every
  // other node's ends. The member to exclude, if the rules say so.
  std::optional<Verdict> judge(std::vector<Output>& out);
  // `name` has reported or joined again: the verdict may be due.
  void accounted(const std::string& name, TimePoint now, std::vector<Output>& out);
  // Gives the pending verdict now (excluding a node if it says so).
  void settle(TimePoint now, std::vector<Output>& out);
  // Whether the job can go on without `member`; why not, when it cannot.
  std::optional<std::string> cannot_exclude(MemberId member) const;
  Duration cooldown_for(const std::string& address) const;
  void exclude(const Verdict& v, TimePoint now, std::vector<Output>& out);
  void unpark(TimePoint now, std::vector<Output>& out);
  void restart_round(std::vector<Output>& out, bool counts, const std::string& reason, TimePoint now);
  std::vector<Output> drop(MemberId member, TimePoint now, const std::string& why, bool fence = false);
  void rebind(MemberId from, MemberId to);
  std::vector<Output> resume(MemberId member, const Resume& r, TimePoint now);
  std::vector<Output> recover(MemberId member, const JoinRequest& request, TimePoint now);
  void end_recovery();
  bool maybe_succeed(std::vector<Output>& out);
  void apply_outcome(MemberId member, const Resume& r, TimePoint now, std::vector<Output>& out);
  void note(std::vector<Output>& out, std::string text, bool warning = false) const;
  std::string world_text() const;
  void close_failed(std::vector<Output>& out, const FailureInfo& root, MemberId failed);
  // A failure of the running round, acted on: a counted restart, or the job closed.
  void fail_round(MemberId member, const FailureInfo& failure, TimePoint now, std::vector<Output>& out);
  // The first member of the running round other than `except` that cannot be
  // reached now (connection down, heartbeat overdue); null when none.
  const Member* unreachable(MemberId except, TimePoint now) const;
  void release_held(TimePoint now, std::vector<Output>& out);
  // The member was heard now (a heartbeat, a report): its silence ends, and a
  // failure held for it is acted on, into out.
  void touch(MemberId member, TimePoint now, std::vector<Output>& out);
  void remove_lost(TimePoint now, std::vector<Output>& out);
  void remove_dead(TimePoint now, std::vector<Output>& out);
  std::vector<MemberId> rank_order() const;
  Status validate(const JoinRequest& r) const;
  std::string missing_text() const;

  Settings settings_;
  std::optional<ReservedRank> reserved_;
  State state_ = State::forming;
  int round_ = 0;
  int restart_count_ = 0;
  bool succeeded_ = false;
  std::map<MemberId, Member> members_;     // everyone connected to the job
  std::map<std::string, MemberId> by_name_;
  std::set<MemberId> participants_;        // joined the current round
  std::set<MemberId> waiting_;             // joined while the round runs
  std::vector<MemberId> ranked_;           // the current round's members by node rank
  std::optional<TimePoint> last_call_;     // forming: completes then if min reached
  std::set<std::string> lost_;             // nodes gone since the last complete round
  std::map<MemberId, out::Assign> assigned_;  // the running round's assignments
  // Whether this core has seen a round of its own; until then joins may tell
  // it the job's history (known_round, known_restart_count, resume).
  bool history_ = false;
  Counters counters_;
  std::optional<HeldFailure> held_;
  std::optional<FailureInfo> last_failure_;
  std::string last_failure_node_;
  TimePoint last_failure_at_{};
  // Exclusions by address, and the root-cause streak: only the latest
  // root's address has one (any other node's root cause ends it).
  std::map<std::string, Exclusion> excluded_;
  std::string streak_address_;
  int streak_ = 0;
  int failures_round_ = -1;
  std::vector<RoundFailure> round_failures_;
  // The verdict on failures_round_, once it ended by a failure: due when
  // every node in `outstanding` reported or joined again, or at `deadline`.
  struct PendingVerdict {
    std::set<std::string> outstanding;
    TimePoint deadline{};
  };
  std::optional<PendingVerdict> verdict_;
  int hung_round_ = -1;  // the round whose hang already had the others take their stacks
  // Rebuilding a running round from resuming members (a restarted server).
  bool recovering_ = false;
  int recovering_world_ = 0;
  TimePoint recovery_deadline_{};
  std::map<int, MemberId> slots_;  // group rank -> member, while recovering
};

}  // namespace muster::rendezvous
