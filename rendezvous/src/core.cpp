#include "muster/rendezvous/core.hpp"

#include <algorithm>
#include <tuple>

namespace muster::rendezvous {
namespace {

std::string seconds_text(Duration d) {
  auto ms = d.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

}  // namespace

Rendezvous::Rendezvous(Settings settings) : settings_(settings) {}

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
    out.push_back(out::Reject{member, Code::closed,
                              succeeded_ ? "the job has finished; start a new one with a new --rdzv-id"
                                         : "the job has failed and its rendezvous is closed; start a new one with a "
                                           "new --rdzv-id"});
    return out;
  }
  if (auto st = validate(request); !st.ok()) {
    out.push_back(out::Reject{member, st.code(), st.message()});
    return out;
  }
  // An agent that reconnects under the same name replaces its old self.
  if (auto named = by_name_.find(request.node_name); named != by_name_.end() && named->second != member) {
    auto more = drop(named->second, now, "reconnected as a new member");
    out.insert(out.end(), more.begin(), more.end());
  }
  if (state_ == State::closed) return out;
  auto& m = members_[member];
  if (!m.request.node_name.empty() && m.request.node_name != request.node_name) by_name_.erase(m.request.node_name);
  by_name_[request.node_name] = member;
  m.request = request;
  m.last_seen = now;
  m.join_deadline = saturating_add(now, settings_.join_timeout);
  m.done = false;

  const auto max = static_cast<std::size_t>(settings_.max_nodes);
  const auto min = static_cast<std::size_t>(settings_.min_nodes);
  if (state_ == State::forming) {
    if (participants_.count(member) || participants_.size() < max) {
      participants_.insert(member);
      waiting_.erase(member);
      if (participants_.size() >= min) last_call_ = saturating_add(now, settings_.last_call_timeout);
      if (participants_.size() == max) complete_round(out);
    } else {
      waiting_.insert(member);
    }
    return out;
  }
  // Running: a newcomer below max nodes is admitted by a new round.
  waiting_.insert(member);
  if (ranked_.size() < max) {
    restart_round(out, false, "node " + request.node_name + " is waiting to join", now);
  }
  return out;
}

std::vector<Output> Rendezvous::heartbeat(MemberId member, TimePoint now) {
  auto it = members_.find(member);
  if (it != members_.end()) it->second.last_seen = now;
  return {};
}

std::vector<MemberId> Rendezvous::rank_order() const {
  std::vector<MemberId> order(participants_.begin(), participants_.end());
  auto key = [&](MemberId id) {
    const auto& r = members_.at(id).request;
    return std::make_tuple(settings_.static_ranks ? r.node_rank.value_or(0) : 0, !r.is_host, r.address, r.node_name);
  };
  std::sort(order.begin(), order.end(), [&](MemberId a, MemberId b) { return key(a) < key(b); });
  return order;
}

void Rendezvous::complete_round(std::vector<Output>& out) {
  ranked_ = rank_order();
  std::vector<NodeSlot> slots;
  for (MemberId id : ranked_) {
    const auto& r = members_.at(id).request;
    slots.push_back({r.role, r.local_world_size});
  }
  auto ranks = assign_worker_ranks(slots);
  const auto& master = members_.at(ranked_.front()).request;
  for (std::size_t i = 0; i < ranked_.size(); ++i) {
    members_.at(ranked_[i]).done = false;
    out.push_back(out::Assign{ranked_[i], round_, restart_count_, static_cast<int>(i),
                              static_cast<int>(ranked_.size()), ranks[i], master.address, master.store_port});
  }
  state_ = State::running;
  last_call_.reset();
  lost_.clear();
}

void Rendezvous::restart_round(std::vector<Output>& out, bool counts, const std::string& reason, TimePoint now) {
  ++round_;
  if (counts) ++restart_count_;
  // Everyone gets a full join_timeout for the new round.
  for (auto& [id, m] : members_) m.join_deadline = saturating_add(now, settings_.join_timeout);
  for (MemberId id : ranked_) {
    if (members_.count(id)) out.push_back(out::Restart{id, round_, counts, reason});
  }
  ranked_.clear();
  participants_.clear();
  last_call_.reset();
  state_ = State::forming;
  // Those waiting to join are the first participants of the new round.
  const auto max = static_cast<std::size_t>(settings_.max_nodes);
  for (auto it = waiting_.begin(); it != waiting_.end() && participants_.size() < max;) {
    participants_.insert(*it);
    it = waiting_.erase(it);
  }
}

void Rendezvous::close_failed(std::vector<Output>& out, const FailureInfo& root, MemberId failed) {
  state_ = State::closed;
  std::string node = members_.count(failed) ? members_.at(failed).request.node_name : "?";
  std::string msg = "the workers of node " + node + " failed with no restarts left (rank " +
                    std::to_string(root.global_rank) + ", exit code " + std::to_string(root.exitcode) + ")";
  for (const auto& [id, m] : members_) out.push_back(out::Finished{id, false, root, msg});
  members_.clear();
  by_name_.clear();
  participants_.clear();
  waiting_.clear();
  ranked_.clear();
}

std::vector<Output> Rendezvous::workers_failed(MemberId member, int round, const FailureInfo& failure, TimePoint now) {
  std::vector<Output> out;
  heartbeat(member, now);
  // A report about an earlier round comes from workers already being stopped.
  if (state_ != State::running || round != round_ ||
      std::find(ranked_.begin(), ranked_.end(), member) == ranked_.end()) {
    return out;
  }
  if (restart_count_ < settings_.max_restarts) {
    const auto& name = members_.at(member).request.node_name;
    restart_round(out, true,
                  "the workers of node " + name + " failed (rank " + std::to_string(failure.global_rank) +
                      ", exit code " + std::to_string(failure.exitcode) + ")",
                  now);
    return out;
  }
  close_failed(out, failure, member);
  return out;
}

std::vector<Output> Rendezvous::workers_succeeded(MemberId member, int round, TimePoint now) {
  std::vector<Output> out;
  heartbeat(member, now);
  if (state_ != State::running || round != round_) return out;
  auto it = members_.find(member);
  if (it == members_.end() || std::find(ranked_.begin(), ranked_.end(), member) == ranked_.end()) return out;
  it->second.done = true;
  for (MemberId id : ranked_) {
    if (!members_.at(id).done) return out;
  }
  succeeded_ = true;
  state_ = State::closed;
  for (const auto& [id, m] : members_) {
    bool ran = std::find(ranked_.begin(), ranked_.end(), id) != ranked_.end();
    if (ran) out.push_back(out::Finished{id, true, std::nullopt, "every node's workers succeeded"});
    else out.push_back(out::Reject{id, Code::closed, "the job finished before this node could join"});
  }
  members_.clear();
  by_name_.clear();
  participants_.clear();
  waiting_.clear();
  return out;
}

std::vector<Output> Rendezvous::leave(MemberId member, TimePoint now) { return drop(member, now, "left the job"); }

std::vector<Output> Rendezvous::drop(MemberId member, TimePoint now, const std::string& why) {
  std::vector<Output> out;
  auto it = members_.find(member);
  if (it == members_.end()) return out;
  std::string name = it->second.request.node_name;
  by_name_.erase(name);
  members_.erase(it);
  waiting_.erase(member);
  participants_.erase(member);
  lost_.insert(name);
  if (state_ == State::running && std::find(ranked_.begin(), ranked_.end(), member) != ranked_.end()) {
    ranked_.erase(std::remove(ranked_.begin(), ranked_.end(), member), ranked_.end());
    restart_round(out, false, "node " + name + " " + why, now);
    return out;
  }
  if (state_ == State::forming && participants_.size() < static_cast<std::size_t>(settings_.min_nodes)) {
    last_call_.reset();
  }
  return out;
}

void Rendezvous::remove_dead(TimePoint now, std::vector<Output>& out) {
  std::vector<MemberId> dead;
  for (const auto& [id, m] : members_) {
    if (now >= saturating_add(m.last_seen, settings_.dead_after())) dead.push_back(id);
  }
  for (MemberId id : dead) {
    auto more = drop(id, now, "stopped answering for " + seconds_text(settings_.dead_after()));
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
  remove_dead(now, out);
  if (state_ == State::closed) return out;
  const auto min = static_cast<std::size_t>(settings_.min_nodes);
  if (state_ == State::forming && last_call_ && now >= *last_call_ && participants_.size() >= min &&
      !settings_.static_ranks) {
    complete_round(out);
  }
  // Joiners whose round did not complete in time, and surplus nodes that never got a place.
  std::vector<MemberId> expired;
  for (const auto& [id, m] : members_) {
    bool pending = waiting_.count(id) || state_ == State::forming;
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
    if (state_ == State::forming && participants_.size() < min) last_call_.reset();
  }
  return out;
}

Duration Rendezvous::shortest_timeout() const {
  return std::min({settings_.dead_after(), settings_.last_call_timeout, settings_.join_timeout});
}

std::optional<TimePoint> Rendezvous::next_deadline() const {
  if (state_ == State::closed) return std::nullopt;
  std::optional<TimePoint> next;
  auto consider = [&](TimePoint t) {
    if (!next || t < *next) next = t;
  };
  if (state_ == State::forming && last_call_ && !settings_.static_ranks) consider(*last_call_);
  for (const auto& [id, m] : members_) {
    consider(saturating_add(m.last_seen, settings_.dead_after()));
    bool pending = waiting_.count(id) || state_ == State::forming;
    if (pending) consider(m.join_deadline);
  }
  return next;
}

}  // namespace muster::rendezvous
