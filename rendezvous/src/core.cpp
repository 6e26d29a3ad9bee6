#include "muster/rendezvous/core.hpp"

#include <limits>
#include <algorithm>
#include <tuple>

#include "muster/common/duration.hpp"
#include "muster/common/text.hpp"

namespace muster::rendezvous {

std::string closed_job_text(bool succeeded) {
  return succeeded ? "the job has finished; start a new one with a new --rdzv-id"
                   : "the job has failed and its rendezvous is closed; start a new one with a new --rdzv-id";
}

Rendezvous::Rendezvous(Settings settings) : settings_(settings) {}

Status Rendezvous::accepts_settings(const std::string& job, const Settings& asked) const {
  if (asked.min_nodes != settings_.min_nodes || asked.max_nodes != settings_.max_nodes ||
      asked.static_ranks != settings_.static_ranks) {
    return invalid_argument("job '" + log_excerpt(job, 64) + "' runs with --nnodes=" +
                            std::to_string(settings_.min_nodes) + ":" + std::to_string(settings_.max_nodes) +
                            " and this node asked for " + std::to_string(asked.min_nodes) + ":" +
                            std::to_string(asked.max_nodes) + "; give every node the same --nnodes");
  }
  if (asked.exclude_after != settings_.exclude_after || asked.exclude_cooldown != settings_.exclude_cooldown) {
    return invalid_argument("job '" + log_excerpt(job, 64) + "' runs with --rdzv-conf exclude_after=" +
                            std::to_string(settings_.exclude_after) + ",exclude_cooldown=" +
                            seconds_text(settings_.exclude_cooldown) + " and this node asked for exclude_after=" +
                            std::to_string(asked.exclude_after) + ",exclude_cooldown=" +
                            seconds_text(asked.exclude_cooldown) + "; give every node the same values");
  }
  return {};
}

Status Rendezvous::validate(const JoinRequest& r) const {
  if (r.node_name.empty()) return invalid_argument("a join needs a node name");
  if (r.local_world_size < 1) {
    return invalid_argument("node " + r.node_name + " asks for " + std::to_string(r.local_world_size) +
                            " workers; a node runs at least one");
  }
  if (settings_.static_ranks) {
    if (!r.node_rank || *r.node_rank < 0 || *r.node_rank >= settings_.max_nodes) {
      return invalid_argument("node " + r.node_name + " has no valid --node-rank: the static backend needs one in [0, " +
                              std::to_string(settings_.max_nodes) + ")");
    }
    if (reserved_ && *r.node_rank == reserved_->node_rank && r.node_name != reserved_->node_name) {
      return invalid_argument("--node-rank=" + std::to_string(*r.node_rank) + " of node " + r.node_name +
                              " is already taken by node " + reserved_->node_name +
                              ", which serves this rendezvous; give every node its own rank");
    }
    for (MemberId p : participants_) {
      const auto& other = members_.at(p).request;
      if (other.node_rank == r.node_rank && other.node_name != r.node_name) {
        return invalid_argument("--node-rank=" + std::to_string(*r.node_rank) + " of node " + r.node_name +
                                " is already taken by node " + other.node_name + "; give every node its own rank");
      }
    }
  }
  return {};
}

std::vector<Output> Rendezvous::join(MemberId member, const JoinRequest& request, TimePoint now) {
  std::vector<Output> out;
  if (state_ == State::closed) {
    out.push_back(out::Reject{member, Code::closed, closed_job_text(succeeded_)});
    return out;
  }
  if (auto st = validate(request); !st.ok()) {
    out.push_back(out::Reject{member, st.code(), st.message()});
    return out;
  }
  // One connection is one node: it cannot turn into another.
  if (auto self = members_.find(member); self != members_.end() && self->second.request.node_name != request.node_name) {
    out.push_back(out::Reject{member, Code::invalid_argument,
                              "this connection is already node " + self->second.request.node_name +
                                  " of the job; it cannot join again as " + request.node_name});
    return out;
  }
  if (auto named = by_name_.find(request.node_name); named != by_name_.end() && named->second != member) {
    // The name is an agent's identity: while its member is connected, a
    // second join under it is an impostor or a misconfiguration, never a
    // replacement. A member whose connection broke takes its place back.
    if (members_.at(named->second).connected) {
      out.push_back(out::Reject{member, Code::already_exists,
                                "node " + request.node_name +
                                    " is already a member of this job on another connection; every agent needs its "
                                    "own identity (an agent picks one at start)"});
      note(out, "refused a second join as node " + request.node_name + ": that member is connected", true);
      return out;
    }
    rebind(named->second, member);
    note(out, "node " + request.node_name + " reconnected");
  }
  // A member of the attempt that failed joins again: any report of its
  // failures came before (one connection), so the verdict may be due.
  if (verdict_ && !request.resume && members_.count(member)) accounted(request.node_name, now, out);
  auto known = members_.find(member);
  if (request.resume) {
    if (known != members_.end()) {
      known->second.last_seen = now;
      auto resumed = resume(member, *request.resume, now);
      out.insert(out.end(), resumed.begin(), resumed.end());
      // Back: a failure held for it is a failure now.
      if (held_) release_held(now, out);
      return out;
    }
    return recover(member, request, now);
  }
  // A recovering core learns from a plain join that the round it rebuilds
  // had already ended (the joiner was told to re-form before the restart).
  if (recovering_ && request.known_round > round_) {
    round_ = request.known_round - 1;
    restart_count_ = std::max(restart_count_, request.known_restart_count);
    end_recovery();
    restart_round(out, false, "node " + request.node_name + " was already re-forming the job", now);
  }
  if (!history_) {
    round_ = std::max(round_, request.known_round);
    restart_count_ = std::max(restart_count_, request.known_restart_count);
  }
  // A member that joins again while it holds a place in the running round
  // has given that place up (it stopped its workers): the round re-forms.
  if (known != members_.end() && state_ == State::running &&
      std::find(ranked_.begin(), ranked_.end(), member) != ranked_.end()) {
    ranked_.erase(std::remove(ranked_.begin(), ranked_.end(), member), ranked_.end());
    participants_.erase(member);
    waiting_.insert(member);
    restart_round(out, false, "node " + request.node_name + " joined again", now);
  }
  auto& m = members_[member];
  const bool was_awaiting = m.awaiting_join;
  m.request = request;
  m.request.resume.reset();
  m.last_seen = now;
  m.join_deadline = saturating_add(now, settings_.join_timeout);
  m.done = false;
  m.connected = true;
  m.closed_at.reset();
  m.awaiting_join = false;
  m.forgiven = Duration(0);
  by_name_[request.node_name] = member;

  // An excluded address waits out its cooldown, whichever agent joins from it.
  if (auto ex = excluded_.find(request.address); ex != excluded_.end() && now < ex->second.until) {
    participants_.erase(member);
    waiting_.erase(member);
    m.parked_until = ex->second.until;
    m.join_deadline = saturating_add(ex->second.until, settings_.join_timeout);
    // The excluded agent's own join (sent before it read its exclusion)
    // changes nothing: it joins again after the cooldown. Another agent on
    // that address, or one that knows nothing of exclusions, is taken in then.
    m.awaiting_join = was_awaiting && has_feature(request.features, kFeatureExclude);
    note(out, "node " + request.node_name + " (" + request.address + ") waits: its address is excluded for another " +
                  seconds_text(std::chrono::duration_cast<Duration>(ex->second.until - now)) + " (" +
                  ex->second.why + ")",
         true);
    return out;
  }
  m.parked_until.reset();
  admit(member, now, out);
  return out;
}

void Rendezvous::admit(MemberId member, TimePoint now, std::vector<Output>& out) {
  const auto& request = members_.at(member).request;
  const auto max = static_cast<std::size_t>(settings_.max_nodes);
  const auto min = static_cast<std::size_t>(settings_.min_nodes);
  if (state_ == State::forming) {
    if (participants_.count(member) || participants_.size() < max) {
      participants_.insert(member);
      waiting_.erase(member);
      note(out, "node " + request.node_name + " joined round " + std::to_string(round_) + ": " +
                    std::to_string(participants_.size()) + " of " + std::to_string(settings_.min_nodes) + ".." +
                    std::to_string(settings_.max_nodes) + " nodes");
      if (participants_.size() >= min) last_call_ = saturating_add(now, settings_.last_call_timeout);
      if (participants_.size() == max && verdict_) {
        // Full: the verdict first, which may take a node out of it.
        settle(now, out);
        if (state_ != State::forming) return;
      }
      if (participants_.size() == max) complete_round(out);
    } else {
      waiting_.insert(member);
      note(out, "node " + request.node_name + " waits: round " + std::to_string(round_) + " is full (" +
                    std::to_string(settings_.max_nodes) + " nodes)");
    }
    return;
  }
  // Running: a newcomer below max nodes is admitted by a new round. A node
  // back from an exclusion is a spare: it waits for the round to re-form for
  // another reason rather than stop a job that runs without it.
  waiting_.insert(member);
  if (excluded_.count(request.address)) {
    note(out, "node " + request.node_name + " (" + request.address +
                  ") waits as a spare: it was excluded, and the running round " + std::to_string(round_) +
                  " goes on without it");
    return;
  }
  note(out, "node " + request.node_name + " waits to join the running round " + std::to_string(round_));
  if (!recovering_ && ranked_.size() < max) {
    restart_round(out, false, "node " + request.node_name + " is waiting to join", now);
  }
}

void Rendezvous::rebind(MemberId from, MemberId to) {
  if (members_.count(to)) return;  // join() refuses a connection that is another member already
  auto node = members_.extract(from);
  node.key() = to;
  node.mapped().connected = true;
  node.mapped().closed_at.reset();
  members_.insert(std::move(node));
  by_name_[members_.at(to).request.node_name] = to;
  auto swap_in = [&](std::set<MemberId>& set) {
    if (set.erase(from)) set.insert(to);
  };
  swap_in(participants_);
  swap_in(waiting_);
  std::replace(ranked_.begin(), ranked_.end(), from, to);
  if (auto a = assigned_.extract(from)) {
    a.key() = to;
    a.mapped().member = to;
    assigned_.insert(std::move(a));
  }
  for (auto& [rank, id] : slots_) {
    if (id == from) id = to;
  }
}

// A known member reconnected and says where it was.
std::vector<Output> Rendezvous::resume(MemberId member, const Resume& r, TimePoint now) {
  std::vector<Output> out;
  bool placed = state_ == State::running && std::find(ranked_.begin(), ranked_.end(), member) != ranked_.end();
  if (placed && r.round == round_) {
    out.push_back(out::Resumed{member, round_});
    apply_outcome(member, r, now, out);
    return out;
  }
  // Its round is over (the order to re-form was lost with the connection).
  out.push_back(out::Restart{member, round_, false,
                             "round " + std::to_string(r.round) + " ended while this node was disconnected"});
  return out;
}

void Rendezvous::apply_outcome(MemberId member, const Resume& r, TimePoint now, std::vector<Output>& out) {
  std::vector<Output> more;
  if (r.outcome == Resume::Outcome::succeeded) more = workers_succeeded(member, r.round, now);
  if (r.outcome == Resume::Outcome::failed && r.failure) more = workers_failed(member, r.round, *r.failure, now);
  out.insert(out.end(), more.begin(), more.end());
}

// An unknown member resumes a round: a core without a history (a restarted
// server) rebuilds the round from such members; anyone else was dropped.
std::vector<Output> Rendezvous::recover(MemberId member, const JoinRequest& request, TimePoint now) {
  std::vector<Output> out;
  const Resume& r = *request.resume;
  auto fence = [&](const std::string& why) {
    out.push_back(out::Fenced{member, why, std::nullopt});
    note(out, "fenced node " + request.node_name + ": " + why, true);
    return out;
  };
  // A core without a history rebuilds the round, unless a plain joiner knows
  // it had already ended (it was told to re-form before the restart). Plain
  // joiners that know no later round (newcomers, spares) wait for it.
  bool fresh = !history_ && state_ == State::forming && r.round >= round_;
  for (MemberId id : participants_) {
    if (fresh && members_.at(id).request.known_round > r.round) fresh = false;
  }
  for (MemberId id : waiting_) {
    if (fresh && members_.at(id).request.known_round > r.round) fresh = false;
  }
  if (fresh && !recovering_) {
    waiting_.insert(participants_.begin(), participants_.end());
    participants_.clear();
    last_call_.reset();
  }
  if (!fresh && !recovering_) {
    return fence("it is no longer a member of round " + std::to_string(r.round) + " (the job is at round " +
                 std::to_string(round_) + ")");
  }
  if (recovering_ && (r.round != round_ || r.group_world_size != recovering_world_)) {
    return fence("it resumes round " + std::to_string(r.round) + " of " + std::to_string(r.group_world_size) +
                 " nodes, but round " + std::to_string(round_) + " of " + std::to_string(recovering_world_) +
                 " nodes is being rebuilt");
  }
  if (r.group_rank >= r.group_world_size || slots_.count(r.group_rank) ||
      (settings_.static_ranks && request.node_rank != r.group_rank)) {
    return fence("its group rank " + std::to_string(r.group_rank) + " is taken or out of range");
  }
  if (r.group_world_size > settings_.max_nodes) return fence("its round has more nodes than max_nodes");
  if (!recovering_) {
    recovering_ = true;
    history_ = true;
    state_ = State::running;
    round_ = r.round;
    recovering_world_ = r.group_world_size;
    recovery_deadline_ = saturating_add(now, settings_.dead_after());
    note(out, "rebuilding round " + std::to_string(round_) + " of " + std::to_string(recovering_world_) +
                  " nodes from the members that reconnect");
  }
  restart_count_ = std::max(restart_count_, r.restart_count);
  auto& m = members_[member];
  m.request = request;
  m.request.resume.reset();
  m.last_seen = now;
  m.join_deadline = saturating_add(now, settings_.join_timeout);
  m.connected = true;
  by_name_[request.node_name] = member;
  participants_.insert(member);
  slots_[r.group_rank] = member;
  out::Assign back;
  static_cast<Placement&>(back) = r;
  back.member = member;
  back.features = {kFeatureStacks};
  assigned_[member] = std::move(back);
  ranked_.clear();
  for (const auto& [rank, id] : slots_) ranked_.push_back(id);
  note(out, "node " + request.node_name + " resumed round " + std::to_string(round_) + " as group rank " +
                std::to_string(r.group_rank) + " (" + std::to_string(slots_.size()) + " of " +
                std::to_string(recovering_world_) + ")");
  // How its workers ended while the server was away counts as it would have.
  apply_outcome(member, r, now, out);
  if (!recovering_ || static_cast<int>(slots_.size()) < recovering_world_) return out;
  // Every member is back: the round runs as if nothing had happened.
  end_recovery();
  note(out, "round " + std::to_string(round_) + " rebuilt: " + world_text());
  for (MemberId id : ranked_) out.push_back(out::Resumed{id, round_});
  if (maybe_succeed(out)) return out;
  if (!waiting_.empty() && ranked_.size() < static_cast<std::size_t>(settings_.max_nodes)) {
    restart_round(out, false, "a node is waiting to join", now);
  }
  return out;
}

void Rendezvous::end_recovery() {
  recovering_ = false;
  recovering_world_ = 0;
  slots_.clear();
}

std::vector<Output> Rendezvous::heartbeat(MemberId member, TimePoint now) {
  std::vector<Output> out;
  touch(member, now, out);
  return out;
}

std::optional<out::Waiting> Rendezvous::progress(MemberId member, TimePoint now) const {
  auto it = members_.find(member);
  if (it == members_.end() || state_ == State::closed) return std::nullopt;
  bool pending = waiting_.count(member) || (it->second.parked_until && !it->second.awaiting_join) ||
                 (state_ == State::forming && participants_.count(member));
  if (!pending) return std::nullopt;
  auto left = it->second.join_deadline > now
                  ? std::chrono::duration_cast<Duration>(it->second.join_deadline - now)
                  : Duration(0);
  out::Waiting w{member,
                 round_,
                 static_cast<int>(state_ == State::forming ? participants_.size() : ranked_.size()),
                 static_cast<int>(waiting_.size()),
                 settings_.min_nodes,
                 settings_.max_nodes,
                 left,
                 std::nullopt};
  if (state_ == State::forming && last_call_ && participants_.count(member)) {
    w.last_call_left = *last_call_ > now ? std::chrono::duration_cast<Duration>(*last_call_ - now) : Duration(0);
  }
  return w;
}

void Rendezvous::note(std::vector<Output>& out, std::string text, bool warning) const {
  out.push_back(out::Log{0, warning, std::move(text)});
}

std::string Rendezvous::world_text() const {
  int world = 0;
  for (MemberId id : ranked_) {
    if (auto it = assigned_.find(id); it != assigned_.end()) world = it->second.ranks.global_world_size;
  }
  return std::to_string(ranked_.size()) + " nodes, world size " + std::to_string(world) + ", restart count " +
         std::to_string(restart_count_);
}

std::vector<MemberId> Rendezvous::rank_order() const {
  std::vector<MemberId> order(participants_.begin(), participants_.end());
  auto key = [&](MemberId id) {
    const auto& r = members_.at(id).request;
    return std::make_tuple(settings_.static_ranks ? r.node_rank.value_or(0) : 0,
                           r.launch_order.value_or(std::numeric_limits<int>::max()), !r.is_host, r.address,
                           r.node_name);
  };
  std::sort(order.begin(), order.end(), [&](MemberId a, MemberId b) { return key(a) < key(b); });
  return order;
}

void Rendezvous::complete_round(std::vector<Output>& out) {
  ++counters_.rounds;
  ranked_ = rank_order();
  std::vector<NodeSlot> slots;
  for (MemberId id : ranked_) {
    const auto& r = members_.at(id).request;
    slots.push_back({r.role, r.local_world_size});
  }
  auto ranks = assign_worker_ranks(slots);
  const auto& master = members_.at(ranked_.front()).request;
  assigned_.clear();
  for (std::size_t i = 0; i < ranked_.size(); ++i) {
    members_.at(ranked_[i]).done = false;
    out::Assign a;
    a.member = ranked_[i];
    a.features = {kFeatureStacks};
    a.round = round_;
    a.restart_count = restart_count_;
    a.group_rank = static_cast<int>(i);
    a.group_world_size = static_cast<int>(ranked_.size());
    a.ranks = ranks[i];
    a.master_addr = master.address;
    a.master_port = master.store_port;
    assigned_[ranked_[i]] = a;
    out.push_back(a);
  }
  state_ = State::running;
  history_ = true;
  last_call_.reset();
  lost_.clear();
  note(out, "round " + std::to_string(round_) + " complete: " + world_text());
}

void Rendezvous::restart_round(std::vector<Output>& out, bool counts, const std::string& reason, TimePoint now) {
  if (counts) ++counters_.restarts;
  note(out, "round " + std::to_string(round_) + " ends: " + reason +
                (counts ? " (restart " + std::to_string(restart_count_ + 1) + " of " +
                              std::to_string(settings_.max_restarts) + ")"
                        : ""));
  ++round_;
  if (counts) ++restart_count_;
  held_.reset();
  end_recovery();
  // Everyone gets a full join_timeout for the new round.
  for (auto& [id, m] : members_) {
    TimePoint from = m.parked_until && *m.parked_until > now ? *m.parked_until : now;
    m.join_deadline = saturating_add(from, settings_.join_timeout);
  }
  for (MemberId id : ranked_) {
    if (members_.count(id)) out.push_back(out::Restart{id, round_, counts, reason});
  }
  ranked_.clear();
  assigned_.clear();
  participants_.clear();
  last_call_.reset();
  state_ = State::forming;
  // Those waiting to join are the first participants of the new round.
  const auto max = static_cast<std::size_t>(settings_.max_nodes);
  for (auto it = waiting_.begin(); it != waiting_.end() && participants_.size() < max;) {
    participants_.insert(*it);
    it = waiting_.erase(it);
  }
  // Enough of them for a round: the last call runs as after a join.
  if (participants_.size() >= static_cast<std::size_t>(settings_.min_nodes)) {
    last_call_ = saturating_add(now, settings_.last_call_timeout);
  }
}

void Rendezvous::close_failed(std::vector<Output>& out, const FailureInfo& root, MemberId failed) {
  state_ = State::closed;
  held_.reset();
  verdict_.reset();
  end_recovery();
  std::string node = members_.count(failed) ? members_.at(failed).request.node_name : "?";
  std::string msg = "the workers of node " + node + " failed with no restarts left (rank " +
                    std::to_string(root.global_rank) + ", exit code " + std::to_string(root.exitcode) + ")";
  for (const auto& [address, ex] : excluded_) {
    msg += "; node " + ex.node_name + " (" + address + ") was excluded " + std::to_string(ex.count) +
           (ex.count == 1 ? " time" : " times") + ": " + ex.why;
  }
  for (const auto& [id, m] : members_) out.push_back(out::Finished{id, false, root, msg});
  note(out, "job failed: " + msg, true);
  members_.clear();
  by_name_.clear();
  participants_.clear();
  waiting_.clear();
  ranked_.clear();
  assigned_.clear();
}

void Rendezvous::touch(MemberId member, TimePoint now, std::vector<Output>& out) {
  auto it = members_.find(member);
  if (it == members_.end()) return;
  it->second.last_seen = now;
  it->second.forgiven = Duration(0);
  // Heard: a failure held while it could not be reached may be one now.
  if (held_) release_held(now, out);
}

std::vector<Output> Rendezvous::workers_failed(MemberId member, int round, const FailureInfo& failure, TimePoint now) {
  std::vector<Output> out;
  touch(member, now, out);
  // A late report about the round a failure ended, before the verdict on
  // it: it may have failed first, which makes it that round's root cause.
  if (verdict_ && round == failures_round_ && round != round_ && members_.count(member)) {
    record_failure(member, round, failure);
    accounted(members_.at(member).request.node_name, now, out);
    return out;
  }
  // A report about an earlier round comes from workers already being stopped
  // (or from the round a released failure just ended).
  if (state_ != State::running || round != round_ ||
      std::find(ranked_.begin(), ranked_.end(), member) == ranked_.end()) {
    return out;
  }
  record_failure(member, round, failure);
  ++counters_.failures;
  last_failure_ = failure;
  last_failure_node_ = members_.at(member).request.node_name;
  last_failure_at_ = now;
  // Another node of the round cannot be reached: this failure may be what
  // its loss did to the others' collectives. Held until it is back or lost;
  // the first one held is the one that counts.
  if (const Member* gone = unreachable(member, now)) {
    if (!held_) {
      ++counters_.failures_held;
      held_ = HeldFailure{member, round, failure, gone->request.node_name};
      note(out, "the workers of node " + last_failure_node_ + " failed (rank " + std::to_string(failure.global_rank) +
                    ", exit code " + std::to_string(failure.exitcode) + ") while node " + gone->request.node_name +
                    " cannot be reached: held until it is back (a failure) or lost (its consequence)",
           true);
    }
    return out;
  }
  fail_round(member, failure, now, out);
  return out;
}

void Rendezvous::fail_round(MemberId member, const FailureInfo& failure, TimePoint now, std::vector<Output>& out) {
  if (restart_count_ < settings_.max_restarts) {
    // The root cause among the reports so far (a later report of an earlier
    // failure corrects it: workers_failed).
    std::string name = members_.at(member).request.node_name;
    FailureInfo root = failure;
    if (const RoundFailure* r = root_failure()) {
      name = r->node_name;
      root = r->failure;
    }
    std::string reason = "the workers of node " + name + " failed (rank " + std::to_string(root.global_rank) +
                         ", exit code " + std::to_string(root.exitcode) + ")";
    // The verdict (whose failure came first; an exclusion) waits for the
    // other nodes of the round to report or join again.
    PendingVerdict pending{{}, saturating_add(now, kVerdictSettle)};
    for (MemberId id : ranked_) {
      const auto& n = members_.at(id).request.node_name;
      bool reported = std::any_of(round_failures_.begin(), round_failures_.end(),
                                  [&](const RoundFailure& f) { return f.node_name == n; });
      if (!reported) pending.outstanding.insert(n);
    }
    restart_round(out, true, reason, now);
    verdict_ = std::move(pending);
    if (verdict_->outstanding.empty()) settle(now, out);
    return;
  }
  close_failed(out, failure, member);
}

void Rendezvous::record_failure(MemberId member, int round, const FailureInfo& failure) {
  if (round != failures_round_) {
    failures_round_ = round;
    round_failures_.clear();
    verdict_.reset();
  }
  auto it = members_.find(member);
  if (it == members_.end()) return;
  const auto& name = it->second.request.node_name;
  // One report per node and round counts (bounded by the round's size).
  for (const auto& f : round_failures_) {
    if (f.node_name == name) return;
  }
  round_failures_.push_back({name, it->second.request.address, failure});
}

const Rendezvous::RoundFailure* Rendezvous::root_failure() const {
  const RoundFailure* best = nullptr;
  for (const auto& f : round_failures_) {
    if (!best) {
      best = &f;
      continue;
    }
    if (f.failure.exclude_node != best->failure.exclude_node) {
      if (f.failure.exclude_node) best = &f;
      continue;
    }
    // Ties keep the report that came first.
    if (failure_time_ms(f.failure) < failure_time_ms(best->failure)) best = &f;
  }
  return best;
}

void Rendezvous::accounted(const std::string& name, TimePoint now, std::vector<Output>& out) {
  if (!verdict_) return;
  verdict_->outstanding.erase(name);
  if (verdict_->outstanding.empty()) settle(now, out);
}

void Rendezvous::settle(TimePoint now, std::vector<Output>& out) {
  if (!verdict_) return;
  verdict_.reset();
  if (auto v = judge(out)) exclude(*v, now, out);
}

std::optional<Rendezvous::Verdict> Rendezvous::judge(std::vector<Output>& out) {
  const RoundFailure* root = root_failure();
  if (!root) return std::nullopt;
  if (round_failures_.size() > 1 && root != &round_failures_.front()) {
    note(out, "round " + std::to_string(failures_round_) + ": the workers of node " + root->node_name +
                  " failed first (rank " + std::to_string(root->failure.global_rank) + ", exit code " +
                  std::to_string(root->failure.exitcode) + "), before those whose report came first");
  }
  if (streak_address_ != root->address) {
    streak_address_ = root->address;
    streak_ = 0;
  }
  const int streak = ++streak_;
  const bool asked = root->failure.exclude_node;
  if (!asked && (settings_.exclude_after <= 0 || streak < settings_.exclude_after)) return std::nullopt;
  std::string why = asked ? "its worker (rank " + std::to_string(root->failure.global_rank) + ") exited with code " +
                                std::to_string(root->failure.exitcode) +
                                ", which asks for its node's exclusion (--exclude-exit-code)"
                          : "it was the root cause of " + std::to_string(streak) + " failed attempts in a row (exclude_after=" +
                                std::to_string(settings_.exclude_after) + ")";
  auto named = by_name_.find(root->node_name);
  if (named == by_name_.end()) {
    note(out, "node " + root->node_name + " (" + root->address + ") is not excluded although " + why +
                  ": it is no longer a member",
         true);
    return std::nullopt;
  }
  if (auto why_not = cannot_exclude(named->second)) {
    note(out, "node " + root->node_name + " (" + root->address + ") is not excluded although " + why + ": " +
                  *why_not,
         true);
    return std::nullopt;
  }
  return Verdict{named->second, why};
}

std::optional<std::string> Rendezvous::cannot_exclude(MemberId member) const {
  if (settings_.static_ranks) return std::string("the static backend gives every node a fixed rank, none can be spared");
  const auto& m = members_.at(member);
  if (m.request.is_host) {
    return std::string(
        "it hosts the rendezvous (an agent-hosted c10d endpoint), so the job would end with it; run the rendezvous "
        "in musterd to make every node replaceable");
  }
  // Those that can take part without it: not parked, not on its address
  // (excluded with it), not gone (their connection closed).
  std::size_t others = 0;
  for (const auto& [id, other] : members_) {
    if (id == member || other.parked_until || !other.connected || other.closed_at) continue;
    if (other.request.address == m.request.address) continue;
    ++others;
  }
  if (others < static_cast<std::size_t>(settings_.min_nodes)) {
    return "without it " + std::to_string(others) + " node" + (others == 1 ? "" : "s") +
           " would remain, fewer than --nnodes' minimum of " + std::to_string(settings_.min_nodes) +
           ", and no spare waits";
  }
  return std::nullopt;
}

Duration Rendezvous::cooldown_for(const std::string& address) const {
  int before = 0;
  if (auto it = excluded_.find(address); it != excluded_.end()) before = it->second.count;
  Duration cool = std::max(settings_.exclude_cooldown, Duration(0));
  for (int i = 0; i < before && cool < kMaxExcludeCooldown; ++i) cool *= 2;
  return std::min(cool, kMaxExcludeCooldown);
}

void Rendezvous::exclude(const Verdict& v, TimePoint now, std::vector<Output>& out) {
  auto it = members_.find(v.member);
  if (it == members_.end()) return;
  const std::string name = it->second.request.node_name;
  const std::string address = it->second.request.address;
  const Duration cool = cooldown_for(address);
  if (excluded_.size() >= kMaxExclusions && !excluded_.count(address)) {
    for (auto e = excluded_.begin(); e != excluded_.end();) e = e->second.until <= now ? excluded_.erase(e) : std::next(e);
  }
  auto& ex = excluded_[address];
  ex.node_name = name;
  ex.why = v.why;
  ex.until = saturating_add(now, cool);
  ++ex.count;
  if (streak_address_ == address) streak_ = 0;
  ++counters_.excluded;
  out.push_back(out::Fenced{v.member, "this node is excluded from the job for " + seconds_text(cool) + ": " + v.why,
                            cool});
  note(out, "excluded node " + name + " (" + address + ") for " + seconds_text(cool) + " (exclusion " +
                std::to_string(ex.count) + " of this address): " + v.why,
       true);
  // It stays a member, parked: it hears how the job ends, and heartbeats so
  // that a dead one is noticed; its agent's join after the cooldown takes it in.
  it->second.parked_until = ex.until;
  it->second.awaiting_join = true;
  it->second.join_deadline = saturating_add(ex.until, settings_.join_timeout);
  waiting_.erase(v.member);
  participants_.erase(v.member);
  assigned_.erase(v.member);
  // A verdict is given while the round after the failed attempt forms
  // (settle() runs before any round completes), so the member holds no place
  // in a running round: only the forming one can lose its minimum.
  if (state_ == State::forming && participants_.size() < static_cast<std::size_t>(settings_.min_nodes)) {
    last_call_.reset();
  }
}

// Members parked on an excluded address whose cooldown ended join now.
void Rendezvous::unpark(TimePoint now, std::vector<Output>& out) {
  std::vector<MemberId> due;
  for (const auto& [id, m] : members_) {
    if (m.parked_until && !m.awaiting_join && now >= *m.parked_until) due.push_back(id);
  }
  for (MemberId id : due) {
    auto it = members_.find(id);
    if (it == members_.end() || state_ == State::closed) continue;
    it->second.parked_until.reset();
    it->second.join_deadline = saturating_add(now, settings_.join_timeout);
    note(out, "node " + it->second.request.node_name + " (" + it->second.request.address +
                  "): its exclusion is over; it joins");
    admit(id, now, out);
  }
}

const Rendezvous::Member* Rendezvous::unreachable(MemberId except, TimePoint now) const {
  // Overdue: a heartbeat and a half late, far short of the dead-after window.
  const Duration overdue = settings_.keep_alive_interval + settings_.keep_alive_interval / 2;
  for (MemberId id : ranked_) {
    if (id == except) continue;
    auto it = members_.find(id);
    if (it == members_.end()) continue;
    const Member& m = it->second;
    if (!m.connected || now > saturating_add(m.last_seen, overdue)) return &m;
  }
  return nullptr;
}

// The member a held failure waited for is back: the failure is one, as any other.
void Rendezvous::release_held(TimePoint now, std::vector<Output>& out) {
  if (!held_) return;
  if (state_ != State::running || held_->round != round_ || !members_.count(held_->member)) {
    held_.reset();
    return;
  }
  if (unreachable(held_->member, now)) return;
  HeldFailure held = std::move(*held_);
  held_.reset();
  note(out, "node " + held.unreachable + " is back: the failure of node " +
                members_.at(held.member).request.node_name + "'s workers counts");
  fail_round(held.member, held.failure, now, out);
}

std::vector<Output> Rendezvous::workers_succeeded(MemberId member, int round, TimePoint now) {
  std::vector<Output> out;
  touch(member, now, out);
  if (state_ != State::running || round != round_) return out;
  auto it = members_.find(member);
  if (it == members_.end() || std::find(ranked_.begin(), ranked_.end(), member) == ranked_.end()) return out;
  it->second.done = true;
  maybe_succeed(out);
  return out;
}

std::vector<Output> Rendezvous::worker_hung(MemberId member, int round, int global_rank, TimePoint now) {
  std::vector<Output> out;
  touch(member, now, out);
  if (state_ != State::running || round != round_ ||
      std::find(ranked_.begin(), ranked_.end(), member) == ranked_.end()) {
    return out;
  }
  if (hung_round_ == round_) return out;  // the others were asked already
  hung_round_ = round_;
  const std::string reason = "rank " + std::to_string(global_rank) + " on node " +
                             members_.at(member).request.node_name + " was taken for hung";
  std::size_t asked = 0;
  for (MemberId id : ranked_) {
    if (id == member || !has_feature(members_.at(id).request.features, kFeatureStacks)) continue;
    out.push_back(out::DumpStacks{id, reason});
    ++asked;
  }
  note(out, reason + ": " + std::to_string(asked) + " other node" + (asked == 1 ? "" : "s") +
                " of round " + std::to_string(round_) + " take their workers' stacks",
       true);
  return out;
}

std::vector<Output> Rendezvous::request_stacks(const std::string& who, std::size_t& unable) {
  std::vector<Output> out;
  unable = 0;
  if (state_ != State::running) return out;
  for (MemberId id : ranked_) {
    if (has_feature(members_.at(id).request.features, kFeatureStacks)) out.push_back(out::DumpStacks{id, "asked by " + who});
    else ++unable;
  }
  return out;
}

// The job succeeds once every node of the running round reported success.
bool Rendezvous::maybe_succeed(std::vector<Output>& out) {
  if (state_ != State::running || recovering_ || ranked_.empty()) return false;
  for (MemberId id : ranked_) {
    if (!members_.at(id).done) return false;
  }
  succeeded_ = true;
  state_ = State::closed;
  for (const auto& [id, m] : members_) {
    bool ran = std::find(ranked_.begin(), ranked_.end(), id) != ranked_.end();
    if (ran) {
      out.push_back(out::Finished{id, true, std::nullopt, "every node's workers succeeded"});
    } else if (m.awaiting_join) {
      // Excluded, it did its part by stepping aside: the job succeeded for it too.
      out.push_back(out::Finished{id, true, std::nullopt, "the job succeeded without this node, which was excluded"});
    } else {
      out.push_back(out::Reject{id, Code::closed, "the job finished before this node could join"});
    }
  }
  note(out, "job finished: every node's workers succeeded in round " + std::to_string(round_));
  members_.clear();
  by_name_.clear();
  participants_.clear();
  waiting_.clear();
  assigned_.clear();
  return true;
}

std::vector<Output> Rendezvous::leave(MemberId member, TimePoint now) {
  if (members_.count(member)) ++counters_.left;
  return drop(member, now, "left the job");
}

void Rendezvous::disconnected(MemberId member, TimePoint now, Disconnect how) {
  auto it = members_.find(member);
  if (it == members_.end()) return;
  it->second.connected = false;
  if (how == Disconnect::closed_by_peer) it->second.closed_at = now;
}

std::vector<Output> Rendezvous::drop(MemberId member, TimePoint now, const std::string& why, bool fence) {
  std::vector<Output> out;
  auto it = members_.find(member);
  if (it == members_.end()) return out;
  std::string name = it->second.request.node_name;
  // Told, if its connection still works, so it stops workers of a world
  // that goes on without it.
  if (fence) out.push_back(out::Fenced{member, "this node " + why + " and was dropped from the job", std::nullopt});
  note(out, "lost node " + name + ": it " + why, true);
  by_name_.erase(name);
  members_.erase(it);
  waiting_.erase(member);
  participants_.erase(member);
  assigned_.erase(member);
  for (auto s = slots_.begin(); s != slots_.end();) {
    s = s->second == member ? slots_.erase(s) : std::next(s);
  }
  lost_.insert(name);
  if (verdict_ && verdict_->outstanding.erase(name) && verdict_->outstanding.empty()) settle(now, out);
  if (state_ == State::running && std::find(ranked_.begin(), ranked_.end(), member) != ranked_.end()) {
    ranked_.erase(std::remove(ranked_.begin(), ranked_.end(), member), ranked_.end());
    std::string reason = "node " + name + " " + why;
    if (held_ && held_->round == round_ && held_->member != member && members_.count(held_->member)) {
      // What the loss did to the others: not a failure of theirs.
      reason += "; the failure of node " + members_.at(held_->member).request.node_name + "'s workers after it (rank " +
                std::to_string(held_->failure.global_rank) + ", exit code " +
                std::to_string(held_->failure.exitcode) + ") is its consequence, not counted";
    }
    restart_round(out, false, reason, now);
    return out;
  }
  if (state_ == State::forming && participants_.size() < static_cast<std::size_t>(settings_.min_nodes)) {
    last_call_.reset();
  }
  return out;
}

void Rendezvous::remove_lost(TimePoint now, std::vector<Output>& out) {
  std::vector<MemberId> lost;
  for (const auto& [id, m] : members_) {
    if (m.closed_at && !m.connected && now >= saturating_add(*m.closed_at, kLossGrace)) lost.push_back(id);
  }
  for (MemberId id : lost) {
    auto it = members_.find(id);
    if (it == members_.end()) continue;
    ++counters_.lost_to_close;
    const std::string address = it->second.request.address;
    auto more = drop(id, now,
                     "(" + address + ") closed its connection without leaving (its agent was killed, or its machine "
                     "went down) and was not back within " + seconds_text(kLossGrace),
                     true);
    out.insert(out.end(), more.begin(), more.end());
  }
}

void Rendezvous::remove_dead(TimePoint now, std::vector<Output>& out) {
  std::vector<MemberId> dead;
  for (const auto& [id, m] : members_) {
    if (now >= saturating_add(m.last_seen, settings_.dead_after())) dead.push_back(id);
  }
  for (MemberId id : dead) {
    ++counters_.lost_to_silence;
    auto more = drop(id, now, "stopped answering for " + seconds_text(settings_.dead_after()), true);
    out.insert(out.end(), more.begin(), more.end());
  }
}

std::string Rendezvous::missing_text() const {
  std::string text = std::to_string(participants_.size()) + " of at least " + std::to_string(settings_.min_nodes) +
                     " nodes joined";
  if (!lost_.empty()) {
    text += "; lost:";
    for (const auto& n : lost_) text += " " + n;
  }
  return text;
}

std::vector<Output> Rendezvous::tick(TimePoint now) {
  std::vector<Output> out;
  if (state_ == State::closed) return out;
  remove_lost(now, out);
  remove_dead(now, out);
  if (state_ == State::closed) return out;
  if (verdict_ && now >= verdict_->deadline) settle(now, out);
  unpark(now, out);
  if (recovering_ && now >= recovery_deadline_) {
    restart_round(out, false,
                  std::to_string(recovering_world_ - static_cast<int>(slots_.size())) + " of " +
                      std::to_string(recovering_world_) + " nodes did not come back within " +
                      seconds_text(settings_.dead_after()) + " after the rendezvous restarted",
                  now);
  }
  const auto min = static_cast<std::size_t>(settings_.min_nodes);
  if (state_ == State::forming && last_call_ && now >= *last_call_ && participants_.size() >= min &&
      !settings_.static_ranks) {
    settle(now, out);  // a pending verdict may take a node out of the round
    if (state_ == State::forming && last_call_ && participants_.size() >= min) complete_round(out);
  }
  // Joiners whose round did not complete in time, and surplus nodes that never got a place.
  std::vector<MemberId> expired;
  for (const auto& [id, m] : members_) {
    bool pending = waiting_.count(id) || m.parked_until || state_ == State::forming;
    if (pending && now >= m.join_deadline) expired.push_back(id);
  }
  if (!expired.empty()) {
    std::string why = "the rendezvous did not complete within join_timeout (" + seconds_text(settings_.join_timeout) +
                      "): " + missing_text();
    for (MemberId id : expired) {
      out.push_back(out::Reject{id, Code::timeout, why});
      by_name_.erase(members_.at(id).request.node_name);
      members_.erase(id);
      waiting_.erase(id);
      participants_.erase(id);
    }
    note(out, std::to_string(expired.size()) + " nodes gave up: " + why, true);
    if (state_ == State::forming && participants_.size() < min) last_call_.reset();
  }
  return out;
}

void Rendezvous::forgive(Duration lag, TimePoint now) {
  if (lag.count() <= 0) return;
  const Duration cap = settings_.dead_after();
  for (auto& [id, m] : members_) {
    Duration room = cap - m.forgiven;
    if (room.count() <= 0) continue;
    if (m.last_seen >= now) continue;  // heard since
    Duration add = std::min({lag, room, std::chrono::duration_cast<Duration>(now - m.last_seen)});
    m.last_seen += add;
    m.forgiven += add;
  }
}

Duration Rendezvous::shortest_timeout() const {
  // (A member parked on an excluded address may be taken in up to this much
  // late: it waits a cooldown of minutes anyway.)
  return std::min({settings_.dead_after(), settings_.last_call_timeout, settings_.join_timeout, kLossGrace,
                   kVerdictSettle});
}

std::optional<TimePoint> Rendezvous::next_deadline() const {
  if (state_ == State::closed) return std::nullopt;
  std::optional<TimePoint> next;
  auto consider = [&](TimePoint t) {
    if (!next || t < *next) next = t;
  };
  if (state_ == State::forming && last_call_ && !settings_.static_ranks) consider(*last_call_);
  if (recovering_) consider(recovery_deadline_);
  if (verdict_) consider(verdict_->deadline);
  for (const auto& [id, m] : members_) {
    consider(saturating_add(m.last_seen, settings_.dead_after()));
    if (m.closed_at && !m.connected) consider(saturating_add(*m.closed_at, kLossGrace));
    if (m.parked_until && !m.awaiting_join) consider(*m.parked_until);
    bool pending = waiting_.count(id) || m.parked_until || state_ == State::forming;
    if (pending) consider(m.join_deadline);
  }
  return next;
}

const char* state_name(State s) {
  switch (s) {
    case State::forming: return "forming";
    case State::running: return "running";
    case State::closed: return "closed";
  }
  return "?";
}

JobView Rendezvous::view(TimePoint now, std::size_t from, std::size_t limit) const {
  JobView v;
  v.state = state_;
  v.round = round_;
  v.restart_count = restart_count_;
  v.settings = settings_;
  v.in_round = participants_.size();
  v.total_members = members_.size();
  // Order light entries, then build views only for the slice asked for.
  struct Entry {
    const MemberId* id;
    const Member* member;
    std::optional<int> group_rank;
  };
  std::vector<Entry> order;
  order.reserve(members_.size());
  for (const auto& [id, m] : members_) {
    Entry e{&id, &m, std::nullopt};
    if (auto a = assigned_.find(id); a != assigned_.end() && state_ == State::running) e.group_rank = a->second.group_rank;
    order.push_back(e);
  }
  auto before = [](const Entry& a, const Entry& b) {
    if (a.group_rank.has_value() != b.group_rank.has_value()) return a.group_rank.has_value();
    if (a.group_rank && *a.group_rank != *b.group_rank) return *a.group_rank < *b.group_rank;
    return a.member->request.node_name < b.member->request.node_name;
  };
  if (from < order.size() && limit > 0) {
    auto first = order.begin() + static_cast<std::ptrdiff_t>(from);
    auto last = order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), from + std::min(limit, order.size())));
    std::nth_element(order.begin(), first, order.end(), before);
    std::partial_sort(first, last, order.end(), before);
    for (auto it = first; it != last; ++it) {
      const Member& m = *it->member;
      MemberView mv;
      mv.node_name = m.request.node_name;
      mv.address = m.request.address;
      mv.role = m.request.role;
      mv.local_world_size = m.request.local_world_size;
      mv.group_rank = it->group_rank;
      mv.in_round = participants_.count(*it->id) > 0;
      mv.waiting = waiting_.count(*it->id) > 0;
      mv.connected = m.connected;
      mv.since_heard = std::chrono::duration_cast<Duration>(now - m.last_seen);
      if (m.parked_until) {
        mv.parked_for = *m.parked_until > now ? std::chrono::duration_cast<Duration>(*m.parked_until - now) : Duration(0);
      }
      v.members.push_back(std::move(mv));
    }
  }
  if (last_failure_) {
    v.last_failure = last_failure_;
    v.last_failure_node = last_failure_node_;
    v.since_last_failure = std::chrono::duration_cast<Duration>(now - last_failure_at_);
  }
  for (const auto& [address, ex] : excluded_) {
    v.exclusions.push_back({address, ex.node_name, ex.why, ex.count,
                            ex.until > now ? std::chrono::duration_cast<Duration>(ex.until - now) : Duration(0)});
  }
  return v;
}

}  // namespace muster::rendezvous
