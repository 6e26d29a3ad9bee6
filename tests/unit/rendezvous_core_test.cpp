#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "muster/rendezvous/core.hpp"

using namespace muster::rendezvous;
using namespace std::chrono_literals;

namespace {

// A fake clock: tests move time by hand. Members that joined heartbeat every
// second of advanced time unless the test keeps them silent.
struct Job {
  Rendezvous rdzv;
  TimePoint now{};
  std::set<MemberId> agents;
  explicit Job(Settings s) : rdzv(s) {}
  std::vector<Output> join(MemberId id, std::string name, int nproc = 1, std::string addr = "", bool host = false,
                           std::optional<int> rank = std::nullopt, std::optional<int> launch_order = std::nullopt) {
    JoinRequest r;
    r.launch_order = launch_order;
    r.node_name = std::move(name);
    r.address = addr.empty() ? r.node_name + ".cluster" : addr;
    r.local_world_size = nproc;
    r.store_port = 40000 + static_cast<int>(id);
    r.is_host = host;
    r.node_rank = rank;
    agents.insert(id);
    return quiet(rdzv.join(id, r, now));
  }
  // The outputs for members, without the host's log lines.
  static std::vector<Output> quiet(std::vector<Output> outs) {
    outs.erase(std::remove_if(outs.begin(), outs.end(), [](const Output& o) { return std::holds_alternative<out::Log>(o); }),
               outs.end());
    return outs;
  }
  std::vector<Output> advance(Duration d, std::set<MemberId> silent = {}) {
    std::vector<Output> out;
    TimePoint end = now + d;
    while (now < end) {
      now = std::min(end, now + Duration(1000));
      for (MemberId id : agents) {
        if (!silent.count(id)) rdzv.heartbeat(id, now);
      }
      auto more = quiet(rdzv.tick(now));
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }
};

Settings settings(int min, int max, int restarts = 0) {
  Settings s;
  s.min_nodes = min;
  s.max_nodes = max;
  s.max_restarts = restarts;
  s.join_timeout = 600s;
  s.last_call_timeout = 30s;
  s.keep_alive_interval = 5s;
  s.keep_alive_max_attempt = 3;
  return s;
}

template <typename T>
std::vector<T> all(const std::vector<Output>& outs) {
  std::vector<T> v;
  for (const auto& o : outs) {
    if (auto* x = std::get_if<T>(&o)) v.push_back(*x);
  }
  return v;
}

const out::Assign& assign_of(const std::vector<out::Assign>& v, MemberId id) {
  for (const auto& a : v) {
    if (a.member == id) return a;
  }
  FAIL("no assignment for member " << id);
  return v.front();
}

}  // namespace

TEST_CASE("a round completes at once when max nodes have joined", "[rdzv]") {
  Job job(settings(2, 2));
  CHECK(job.join(1, "b", 2).empty());
  auto out = job.join(2, "a", 3);
  auto assigns = all<out::Assign>(out);
  REQUIRE(assigns.size() == 2);
  CHECK(job.rdzv.state() == State::running);
  // Ranks in address order; global ranks from each node's local world size.
  auto& a = assign_of(assigns, 2);
  auto& b = assign_of(assigns, 1);
  CHECK(a.group_rank == 0);
  CHECK(b.group_rank == 1);
  CHECK(a.ranks.base_global_rank == 0);
  CHECK(b.ranks.base_global_rank == 3);
  CHECK(a.ranks.global_world_size == 5);
  CHECK(a.group_world_size == 2);
  // MASTER_ADDR/PORT from node rank 0.
  CHECK(b.master_addr == "a.cluster");
  CHECK(b.master_port == 40002);
}

TEST_CASE("a round closes after last_call_timeout once min nodes joined", "[rdzv]") {
  Job job(settings(2, 4));
  job.join(1, "n1");
  CHECK(job.advance(29s).empty());
  job.join(2, "n2");  // min reached: the last call starts now
  CHECK(all<out::Assign>(job.advance(29s)).empty());
  job.join(3, "n3");  // a later join restarts the last call
  CHECK(all<out::Assign>(job.advance(29s)).empty());
  CHECK(job.rdzv.next_deadline().has_value());
  auto out = job.advance(1s);
  CHECK(all<out::Assign>(out).size() == 3);
}

TEST_CASE("the hosting node gets node rank 0", "[rdzv]") {
  Job job(settings(2, 2));
  job.join(1, "aaa");
  auto assigns = all<out::Assign>(job.join(2, "zzz", 1, "", true));
  CHECK(assign_of(assigns, 2).group_rank == 0);
  CHECK(assign_of(assigns, 1).group_rank == 1);
}

TEST_CASE("nodes a launching command started take their host-list order, ahead of the others", "[rdzv]") {
  Job job(settings(4, 4));
  job.join(1, "aaa", 1, "", true);                 // the host, no order: after the ordered ones
  job.join(2, "bbb", 1, "", false, std::nullopt, 2);
  job.join(3, "ccc", 1, "", false, std::nullopt, 0);
  auto assigns = all<out::Assign>(job.join(4, "ddd", 1, "", false, std::nullopt, 1));
  REQUIRE(assigns.size() == 4);
  CHECK(assign_of(assigns, 3).group_rank == 0);
  CHECK(assign_of(assigns, 4).group_rank == 1);
  CHECK(assign_of(assigns, 2).group_rank == 2);
  CHECK(assign_of(assigns, 1).group_rank == 3);
}

TEST_CASE("the static backend uses the node ranks it is given and waits for max", "[rdzv]") {
  Settings s = settings(1, 3);
  s.static_ranks = true;
  Job job(s);
  job.join(1, "x", 1, "", false, 2);
  job.join(2, "y", 1, "", false, 0);
  CHECK(all<out::Assign>(job.advance(60s)).empty());  // not elastic: no last call
  auto dup = all<out::Reject>(job.join(4, "w", 1, "", false, 0));
  REQUIRE(dup.size() == 1);
  CHECK(dup[0].message.find("already taken by node y") != std::string::npos);
  job.agents.erase(4);
  auto assigns = all<out::Assign>(job.join(3, "z", 1, "", false, 1));
  REQUIRE(assigns.size() == 3);
  CHECK(assign_of(assigns, 1).group_rank == 2);
  CHECK(assign_of(assigns, 2).group_rank == 0);
  CHECK(assign_of(assigns, 3).group_rank == 1);
  CHECK_FALSE(all<out::Reject>(job.join(5, "v", 1, "", false, 9)).empty());
}

TEST_CASE("the static backend's reserved node rank belongs to its owner even before it joins", "[rdzv]") {
  Settings s = settings(2, 2);
  s.static_ranks = true;
  Job job(s);
  job.rdzv.reserve_node_rank({0, "host_0"});
  // The twin comes first, alone: nobody holds rank 0 yet, and still it is refused.
  auto twin = all<out::Reject>(job.join(1, "twin_0", 1, "", false, 0));
  REQUIRE(twin.size() == 1);
  CHECK(twin[0].code == muster::Code::invalid_argument);
  CHECK(twin[0].message.find("--node-rank=0 of node twin_0 is already taken by node host_0, which serves this "
                             "rendezvous") != std::string::npos);
  job.agents.erase(1);
  CHECK(job.rdzv.members() == 0);
  // Another rank is the twin's to take; the owner takes its own.
  CHECK(all<out::Reject>(job.join(2, "other_1", 1, "", false, 1)).empty());
  auto assigns = all<out::Assign>(job.join(3, "host_0", 1, "", false, 0));
  REQUIRE(assigns.size() == 2);
  CHECK(assign_of(assigns, 3).group_rank == 0);
  CHECK(assign_of(assigns, 2).group_rank == 1);
}

TEST_CASE("a reserved node rank means nothing to a job whose nodes are ranked by the rendezvous", "[rdzv]") {
  Job job(settings(2, 2));
  job.rdzv.reserve_node_rank({0, "host_0"});
  job.join(1, "twin_0", 1, "", false, 0);
  auto assigns = all<out::Assign>(job.join(2, "other_1", 1, "", false, 1));
  CHECK(assigns.size() == 2);
}

TEST_CASE("fewer than min nodes within join_timeout fails the joiners", "[rdzv]") {
  Job job(settings(3, 3));
  job.join(1, "n1");
  job.join(2, "n2");
  CHECK(job.advance(599s).empty());
  auto rejects = all<out::Reject>(job.advance(1s));
  REQUIRE(rejects.size() == 2);
  CHECK(rejects[0].code == muster::Code::timeout);
  CHECK(rejects[0].message.find("2 of at least 3 nodes joined") != std::string::npos);
}

TEST_CASE("a dead node is noticed after interval x attempts and the survivors re-form", "[rdzv]") {
  Job job(settings(2, 3));
  job.join(1, "n1");
  job.join(2, "n2");
  job.join(3, "n3");
  REQUIRE(job.rdzv.state() == State::running);
  CHECK(job.advance(14s, {3}).empty());
  auto out = job.advance(1s, {3});  // node 3 silent for 15 s
  auto restarts = all<out::Restart>(out);
  REQUIRE(restarts.size() == 2);
  CHECK_FALSE(restarts[0].counts_as_failure);
  CHECK(restarts[0].reason.find("node n3 stopped answering for 15 s") != std::string::npos);
  CHECK(job.rdzv.state() == State::forming);
  CHECK(job.rdzv.restart_count() == 0);
  // The survivors join the next round; min is reached, the last call runs out.
  job.agents.erase(3);
  job.join(1, "n1");
  job.join(2, "n2");
  auto assigns = all<out::Assign>(job.advance(30s));
  REQUIRE(assigns.size() == 2);
  CHECK(assigns[0].round == 1);
  CHECK(assigns[0].group_world_size == 2);
}

TEST_CASE("below min after a death the survivors wait, then fail naming the lost node", "[rdzv]") {
  Job job(settings(2, 2));
  job.join(1, "n1");
  job.join(2, "n2");
  auto restart = all<out::Restart>(job.advance(15s, {2}));
  REQUIRE(restart.size() == 1);
  job.agents.erase(2);
  job.join(1, "n1");
  CHECK(job.advance(599s).empty());
  auto rejects = all<out::Reject>(job.advance(1s));
  REQUIRE(rejects.size() == 1);
  CHECK(rejects[0].member == 1);
  CHECK(rejects[0].message.find("lost: n2") != std::string::npos);
}

TEST_CASE("a late joiner below max is admitted by a membership restart", "[rdzv]") {
  Job job(settings(1, 3, 0));
  job.join(1, "n1");
  job.advance(30s);
  REQUIRE(job.rdzv.state() == State::running);
  auto out = job.join(2, "n2");
  auto restarts = all<out::Restart>(out);
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0].member == 1);
  CHECK_FALSE(restarts[0].counts_as_failure);
  CHECK(job.rdzv.participants() == 1);  // the newcomer is already in the next round
  job.join(1, "n1");
  auto assigns = all<out::Assign>(job.advance(30s));
  REQUIRE(assigns.size() == 2);
  CHECK(assigns[0].restart_count == 0);
}

TEST_CASE("a joiner beyond max waits and times out if no place frees", "[rdzv]") {
  Job job(settings(1, 1));
  job.join(1, "n1");
  auto out = job.join(2, "n2");
  CHECK(all<out::Restart>(out).empty());
  CHECK(job.rdzv.waiting() == 1);
  auto rejects = all<out::Reject>(job.advance(600s));
  REQUIRE(rejects.size() == 1);
  CHECK(rejects[0].member == 2);
}

TEST_CASE("a worker failure restarts every node and counts, until no restarts are left", "[rdzv]") {
  Job job(settings(2, 2, 1));
  job.join(1, "n1");
  job.join(2, "n2");
  FailureInfo f{3, 1, 7, "n2.cluster", "boom", 100};
  auto out = job.rdzv.workers_failed(2, 0, f, job.now);
  auto restarts = all<out::Restart>(out);
  REQUIRE(restarts.size() == 2);
  CHECK(restarts[0].counts_as_failure);
  CHECK(job.rdzv.restart_count() == 1);
  // A stale report from the stopped round changes nothing.
  CHECK(job.rdzv.workers_failed(1, 0, f, job.now).empty());
  job.join(1, "n1");
  auto assigns = all<out::Assign>(job.join(2, "n2"));
  REQUIRE(assigns.size() == 2);
  CHECK(assigns[0].restart_count == 1);
  auto end = job.rdzv.workers_failed(1, 1, f, job.now);
  auto finished = all<out::Finished>(end);
  REQUIRE(finished.size() == 2);
  CHECK_FALSE(finished[0].success);
  REQUIRE(finished[0].root_cause);
  CHECK(finished[0].root_cause->global_rank == 3);
  CHECK(job.rdzv.state() == State::closed);
  auto late = all<out::Reject>(job.join(9, "late"));
  REQUIRE(late.size() == 1);
  CHECK(late[0].code == muster::Code::closed);
}

TEST_CASE("the job ends when every node's workers succeeded", "[rdzv]") {
  Job job(settings(2, 2));
  job.join(1, "n1");
  job.join(2, "n2");
  CHECK(job.rdzv.workers_succeeded(1, 0, job.now).empty());
  auto out = job.rdzv.workers_succeeded(2, 0, job.now);
  auto finished = all<out::Finished>(out);
  REQUIRE(finished.size() == 2);
  CHECK(finished[0].success);
  CHECK(job.rdzv.state() == State::closed);
  CHECK(job.rdzv.succeeded());
  CHECK(job.rdzv.tick(job.now + 1h).empty());
}

TEST_CASE("a node that leaves a running job triggers a re-form", "[rdzv]") {
  Job job(settings(1, 2));
  job.join(1, "n1");
  job.join(2, "n2");
  auto restarts = all<out::Restart>(job.rdzv.leave(2, job.now));
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0].member == 1);
  CHECK(restarts[0].reason == "node n2 left the job");
}

TEST_CASE("a second join under a connected member's name is refused, never a replacement", "[rdzv][membership]") {
  Job job(settings(2, 2));
  job.join(1, "n1");
  auto r = all<out::Reject>(job.join(7, "n1"));
  REQUIRE(r.size() == 1);
  CHECK(r[0].member == 7);
  CHECK(r[0].code == muster::Code::already_exists);
  CHECK(job.rdzv.participants() == 1);
  auto assigns = all<out::Assign>(job.join(2, "n2"));
  REQUIRE(assigns.size() == 2);
  CHECK(assign_of(assigns, 1).group_rank + assign_of(assigns, 2).group_rank == 1);  // member 1 kept its place
  // Once running, an impostor under a running member's name changes nothing either.
  auto later = job.join(8, "n1");
  CHECK(all<out::Reject>(later).size() == 1);
  CHECK(all<out::Restart>(later).empty());
  CHECK(job.rdzv.state() == State::running);
}

namespace {
JoinRequest resume_request(const std::string& name, const out::Assign& a,
                           Resume::Outcome outcome = Resume::Outcome::running) {
  JoinRequest r;
  r.node_name = name;
  r.address = name + ".cluster";
  r.store_port = 40000;
  Resume res;
  res.round = a.round;
  res.restart_count = a.restart_count;
  res.group_rank = a.group_rank;
  res.group_world_size = a.group_world_size;
  res.ranks = a.ranks;
  res.master_addr = a.master_addr;
  res.master_port = a.master_port;
  res.outcome = outcome;
  if (outcome == Resume::Outcome::failed) res.failure = FailureInfo{a.ranks.base_global_rank, 0, 3, name, "boom", 1, 4242};
  r.resume = res;
  return r;
}
}  // namespace

TEST_CASE("a member whose connection broke resumes its place and nothing restarts", "[rdzv][membership]") {
  Job job(settings(2, 2));
  job.join(1, "n1");
  auto assigns = all<out::Assign>(job.join(2, "n2"));
  auto mine = assign_of(assigns, 2);
  job.rdzv.disconnected(2, job.now);
  CHECK(all<out::Restart>(job.advance(10s, {2})).empty());  // within dead-after: no re-form
  job.agents.erase(2);
  auto back = job.rdzv.join(9, resume_request("n2", mine), job.now);
  job.agents.insert(9);
  auto resumed = all<out::Resumed>(back);
  REQUIRE(resumed.size() == 1);
  CHECK(resumed[0].member == 9);
  CHECK(resumed[0].round == 0);
  CHECK(all<out::Restart>(back).empty());
  CHECK(all<out::Restart>(job.advance(30s)).empty());
  job.rdzv.workers_succeeded(1, 0, job.now);
  auto done = all<out::Finished>(job.rdzv.workers_succeeded(9, 0, job.now));
  CHECK(done.size() == 2);
}

TEST_CASE("a member silent past the window is fenced, and re-admitted when it joins again", "[rdzv][membership]") {
  Job job(settings(2, 3));
  job.join(1, "n1");
  job.join(2, "n2");
  job.join(3, "n3");
  job.advance(30s);  // last call
  REQUIRE(job.rdzv.state() == State::running);
  auto out = job.advance(16s, {3});  // n3 is paused: connected but silent
  auto fenced = all<out::Fenced>(out);
  REQUIRE(fenced.size() == 1);
  CHECK(fenced[0].member == 3);
  CHECK(fenced[0].reason.find("stopped answering") != std::string::npos);
  CHECK(all<out::Restart>(out).size() == 2);
  job.join(1, "n1");
  job.join(2, "n2");
  job.advance(30s, {3});
  REQUIRE(job.rdzv.state() == State::running);  // re-formed with two
  // Its heartbeat is ignored; its join (on the same connection) is a newcomer's.
  CHECK(job.rdzv.heartbeat(3, job.now).empty());
  auto again = job.join(3, "n3");
  CHECK(all<out::Restart>(again).size() == 2);  // below max: a membership restart admits it
  job.join(1, "n1");
  job.join(2, "n2");
  CHECK(job.rdzv.state() == State::running);
  CHECK(job.rdzv.participants() == 3);
}

TEST_CASE("a known member resuming a round that already ended is told to re-form", "[rdzv][membership]") {
  Job job(settings(1, 2, 1));
  job.join(1, "n1");
  auto assigns = all<out::Assign>(job.join(2, "n2"));
  auto mine = assign_of(assigns, 2);
  // Round 0 ends while n2 is still reachable (a failure reported while it is
  // not would wait for it: "a failure reported while a peer is unreachable...").
  job.rdzv.workers_failed(1, 0, FailureInfo{0, 0, 1, "n1", "x", 1, 1}, job.now);
  job.rdzv.disconnected(2, job.now);
  auto back = job.rdzv.join(9, resume_request("n2", mine), job.now);
  auto restarts = all<out::Restart>(back);
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0].member == 9);
  CHECK(restarts[0].next_round == 1);
}

TEST_CASE("an unknown member resuming a job with a history of its own is fenced", "[rdzv][membership]") {
  Job job(settings(1, 2));
  auto assigns = all<out::Assign>(job.join(1, "n1"));
  job.advance(31s);
  out::Assign stale{{0, 0, 1, 2, {2, 4, 2, 4}, "x", 1}, 0, {}};
  auto out = job.rdzv.join(5, resume_request("ghost", stale), job.now);
  auto fenced = all<out::Fenced>(out);
  REQUIRE(fenced.size() == 1);
  CHECK(fenced[0].member == 5);
  CHECK(job.rdzv.members() == 1);
}

TEST_CASE("a restarted rendezvous rebuilds a running round from the members that resume", "[rdzv][membership]") {
  // What the members had been told by the server that went away.
  out::Assign a0{{3, 2, 0, 2, {0, 4, 0, 4}, "n1.cluster", 1234}, 0, {}};
  out::Assign a1{{3, 2, 1, 2, {2, 4, 2, 4}, "n1.cluster", 1234}, 0, {}};
  Job job(settings(2, 2, 5));
  auto first = job.rdzv.join(1, resume_request("n1", a0), job.now);
  job.agents.insert(1);
  CHECK(all<out::Resumed>(first).empty());  // not until the round is whole
  CHECK(job.rdzv.recovering());
  auto second = job.rdzv.join(2, resume_request("n2", a1), job.now);
  job.agents.insert(2);
  auto resumed = all<out::Resumed>(second);
  CHECK(resumed.size() == 2);
  CHECK(all<out::Assign>(second).empty());  // nobody restarts
  CHECK(job.rdzv.round() == 3);
  CHECK(job.rdzv.restart_count() == 2);
  CHECK(job.rdzv.state() == State::running);
  CHECK_FALSE(job.rdzv.recovering());
  // The budget goes on from where it was: a failure is restart 3.
  auto restarts = all<out::Restart>(job.rdzv.workers_failed(1, 3, FailureInfo{0, 0, 1, "n1", "", 1, 7}, job.now));
  REQUIRE(restarts.size() == 2);
  CHECK(restarts[0].counts_as_failure);
  CHECK(job.rdzv.restart_count() == 3);
}

TEST_CASE("a rebuilt round finishes as it would have, outcomes included", "[rdzv][membership]") {
  out::Assign a0{{1, 0, 0, 2, {0, 2, 0, 2}, "n1.cluster", 1234}, 0, {}};
  out::Assign a1{{1, 0, 1, 2, {1, 2, 1, 2}, "n1.cluster", 1234}, 0, {}};
  Job job(settings(2, 2));
  job.rdzv.join(1, resume_request("n1", a0, Resume::Outcome::succeeded), job.now);
  auto out = job.rdzv.join(2, resume_request("n2", a1), job.now);
  CHECK(all<out::Finished>(out).empty());
  auto done = all<out::Finished>(job.rdzv.workers_succeeded(2, 1, job.now));
  REQUIRE(done.size() == 2);
  CHECK(done[0].success);

  Job failing(settings(2, 2, 0));
  failing.rdzv.join(1, resume_request("n1", a0), failing.now);
  auto fin = all<out::Finished>(failing.rdzv.join(2, resume_request("n2", a1, Resume::Outcome::failed), failing.now));
  REQUIRE(fin.size() == 2);
  CHECK_FALSE(fin[0].success);
  REQUIRE(fin[0].root_cause);
  CHECK(fin[0].root_cause->pid == 4242);
}

TEST_CASE("a spare that reaches a restarted rendezvous first waits, and the round is still rebuilt", "[rdzv][membership]") {
  out::Assign a0{{2, 1, 0, 2, {0, 2, 0, 2}, "n1.cluster", 1234}, 0, {}};
  out::Assign a1{{2, 1, 1, 2, {1, 2, 1, 2}, "n1.cluster", 1234}, 0, {}};
  Job job(settings(2, 2, 3));
  job.join(5, "spare");  // knows no round: it never had a place
  job.rdzv.join(1, resume_request("n1", a0), job.now);
  auto out = job.rdzv.join(2, resume_request("n2", a1), job.now);
  CHECK(all<out::Resumed>(out).size() == 2);
  CHECK(all<out::Fenced>(out).empty());
  CHECK(job.rdzv.restart_count() == 1);
  CHECK(job.rdzv.round() == 2);
  CHECK(job.rdzv.waiting() == 1);  // at max_nodes: the spare waits for a place
}

TEST_CASE("a plain join that knows a later round stops a rebuild before it starts", "[rdzv][membership]") {
  out::Assign a0{{2, 1, 0, 2, {0, 2, 0, 2}, "n1.cluster", 1234}, 0, {}};
  Job job(settings(2, 2, 3));
  JoinRequest r;
  r.node_name = "n2";
  r.address = "n2.cluster";
  r.known_round = 3;  // it had been told round 2 ended
  r.known_restart_count = 2;
  job.rdzv.join(2, r, job.now);
  auto out = job.rdzv.join(1, resume_request("n1", a0), job.now);
  CHECK(all<out::Fenced>(out).size() == 1);  // n1 stops its stale workers and joins round 3
}

TEST_CASE("a connection that is one node cannot join again as another", "[rdzv][membership][hardening]") {
  Job job(settings(2, 2));
  job.join(1, "n1");
  job.join(2, "n2");
  job.rdzv.disconnected(2, job.now);
  auto r = all<out::Reject>(job.join(1, "n2"));
  REQUIRE(r.size() == 1);
  CHECK(r[0].message.find("already node n1") != std::string::npos);
  CHECK(job.rdzv.members() == 2);
  // n2 can still take its own place back.
  CHECK(all<out::Reject>(job.join(9, "n2")).empty());
}

TEST_CASE("members that do not come back to a rebuilt round make it re-form, not counted", "[rdzv][membership]") {
  out::Assign a0{{2, 1, 0, 2, {0, 2, 0, 2}, "n1.cluster", 1234}, 0, {}};
  out::Assign a1{{2, 1, 1, 2, {1, 2, 1, 2}, "n1.cluster", 1234}, 0, {}};
  Job job(settings(1, 2, 3));
  job.rdzv.join(1, resume_request("n1", a0), job.now);
  job.agents.insert(1);
  auto out = job.advance(16s);
  auto restarts = all<out::Restart>(out);
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0].member == 1);
  CHECK_FALSE(restarts[0].counts_as_failure);
  CHECK(restarts[0].reason.find("did not come back") != std::string::npos);
  CHECK(job.rdzv.restart_count() == 1);
  // The late one is no longer part of a round: fenced.
  auto late = job.rdzv.join(2, resume_request("n2", a1), job.now);
  CHECK(all<out::Fenced>(late).size() == 1);
}

TEST_CASE("plain joins tell a restarted rendezvous the round and restart count to go on from", "[rdzv][membership]") {
  Job job(settings(2, 2, 5));
  JoinRequest r;
  r.node_name = "n1";
  r.address = "n1.cluster";
  r.known_round = 4;
  r.known_restart_count = 3;
  job.rdzv.join(1, r, job.now);
  r.node_name = "n2";
  r.address = "n2.cluster";
  auto assigns = all<out::Assign>(job.rdzv.join(2, r, job.now));
  REQUIRE(assigns.size() == 2);
  CHECK(assigns[0].round == 4);
  CHECK(assigns[0].restart_count == 3);
  // Once the core has a history of its own, hints change nothing.
  job.rdzv.disconnected(2, job.now);
  r.known_round = 40;
  r.known_restart_count = 30;
  job.rdzv.leave(2, job.now);
  job.rdzv.join(3, r, job.now);
  CHECK(job.rdzv.restart_count() == 3);
}

TEST_CASE("a waiting member can ask where the round stands", "[rdzv][membership]") {
  Job job(settings(2, 3));
  job.join(1, "n1");
  auto p = job.rdzv.progress(1, job.now + 10s);
  REQUIRE(p);
  CHECK(p->joined == 1);
  CHECK(p->min_nodes == 2);
  CHECK(p->max_nodes == 3);
  CHECK(p->join_timeout_left == 590s);
  CHECK_FALSE(p->last_call_left);  // below its minimum: join_timeout is what runs
  job.join(2, "n2");
  // At its minimum the round closes when last_call_timeout (30 s) has passed:
  // that is what a waiting member is told, not join_timeout.
  auto closing = job.rdzv.progress(1, job.now + 10s);
  REQUIRE(closing);
  REQUIRE(closing->last_call_left);
  CHECK(*closing->last_call_left == 20s);
  job.advance(31s);
  CHECK_FALSE(job.rdzv.progress(1, job.now));  // running: nothing to wait for
}

TEST_CASE("bad joins are refused with what to do", "[rdzv]") {
  Job job(settings(1, 2));
  auto r = all<out::Reject>(job.join(1, "n", 0));
  REQUIRE(r.size() == 1);
  CHECK(r[0].message.find("at least one") != std::string::npos);
}

TEST_CASE("next_deadline names the earliest timer", "[rdzv]") {
  Job job(settings(1, 2));
  job.join(1, "n1");
  auto next = job.rdzv.next_deadline();
  REQUIRE(next);
  CHECK(*next == job.now + 15s);  // the heartbeat deadline comes before the 30 s last call
}

TEST_CASE("timeouts near the clock's end saturate instead of wrapping", "[rendezvous][hardening]") {
  auto t = Clock::now();
  CHECK(saturating_add(t, Duration(1LL << 62)) == TimePoint::max());
  CHECK(saturating_add(TimePoint::max() - std::chrono::seconds(1), Duration(5000)) == TimePoint::max());
  CHECK(saturating_add(t, Duration(5)) == t + Duration(5));
  Settings s;
  s.join_timeout = Duration(365LL * 24 * 3600 * 1000);
  s.keep_alive_interval = Duration(365LL * 24 * 3600 * 1000);
  s.keep_alive_max_attempt = 1000000;
  s.min_nodes = 2;
  s.max_nodes = 2;
  Rendezvous r(s);
  JoinRequest j;
  j.node_name = "a";
  CHECK(Job::quiet(r.join(1, j, t)).empty());
  CHECK(Job::quiet(r.tick(t + std::chrono::hours(24))).empty());  // nothing fires early
  CHECK(r.next_deadline().has_value());
}

TEST_CASE("every node of a job gives the same --nnodes and backend, and a closed job says how it ended", "[rdzv]") {
  Settings s;
  s.min_nodes = 1;
  s.max_nodes = 2;
  Job job(s);
  CHECK(job.rdzv.accepts_settings("j", s).ok());
  Settings other = s;
  other.max_nodes = 3;
  auto refused = job.rdzv.accepts_settings("j\n", other);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.code() == muster::Code::invalid_argument);
  CHECK(refused.message() ==
        "job 'j\\x0a' runs with --nnodes=1:2 and this node asked for 1:3; give every node the same --nnodes");
  other = s;
  other.static_ranks = true;
  CHECK_FALSE(job.rdzv.accepts_settings("j", other).ok());
  // Timeouts may differ: each node keeps its own.
  other = s;
  other.join_timeout = 1s;
  CHECK(job.rdzv.accepts_settings("j", other).ok());
  CHECK(closed_job_text(true) == "the job has finished; start a new one with a new --rdzv-id");
  CHECK(closed_job_text(false).find("has failed and its rendezvous is closed") != std::string::npos);
}

namespace {

FailureInfo failure_of(int rank) { return FailureInfo{rank, 0, 1, "host", "worker failed", 1, 100 + rank}; }

bool reason_has(const std::vector<out::Restart>& restarts, const std::string& text) {
  return !restarts.empty() && restarts[0].reason.find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("a member whose side closed its connection without leave is lost after the grace, not counted",
          "[rdzv][loss]") {
  Job job(settings(1, 3));
  job.join(1, "n1");
  job.join(2, "n2");
  job.advance(31s);  // last call: a round of two
  REQUIRE(job.rdzv.state() == State::running);
  job.rdzv.disconnected(2, job.now, Disconnect::closed_by_peer);
  // Within the grace it keeps its place (its agent may be reconnecting).
  auto early = job.advance(kLossGrace - 1s, {2});
  CHECK(all<out::Restart>(early).empty());
  CHECK(job.rdzv.members() == 2);
  // Then it is lost: the round re-forms, no restart counted, far before the dead-after window (15 s).
  auto lost = job.advance(2s, {2});
  auto restarts = all<out::Restart>(lost);
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0].member == 1);
  CHECK_FALSE(restarts[0].counts_as_failure);
  CHECK(reason_has(restarts, "node n2 (n2.cluster) closed its connection without leaving"));
  CHECK(job.rdzv.restart_count() == 0);
  CHECK(job.rdzv.members() == 1);
  CHECK(job.rdzv.counters().lost_to_close == 1);
  CHECK(job.rdzv.counters().lost_to_silence == 0);
}

TEST_CASE("a member that reconnects within the loss grace resumes its place", "[rdzv][loss]") {
  Job job(settings(2, 2));
  job.join(1, "n1");
  auto assigns = all<out::Assign>(job.join(2, "n2"));
  job.rdzv.disconnected(2, job.now, Disconnect::closed_by_peer);
  job.advance(2s, {2});
  auto back = job.rdzv.join(7, resume_request("n2", assign_of(assigns, 2)), job.now);
  CHECK(all<out::Resumed>(back).size() == 1);
  job.agents.insert(7);
  auto later = job.advance(20s, {2});
  CHECK(all<out::Restart>(later).empty());
  CHECK(job.rdzv.members() == 2);
  CHECK(job.rdzv.counters().lost_to_close == 0);
}

TEST_CASE("a broken connection (reset, timeout) still waits out the dead-after window", "[rdzv][loss]") {
  Job job(settings(1, 2));
  job.join(1, "n1");
  job.join(2, "n2");
  job.advance(31s);
  job.rdzv.disconnected(2, job.now, Disconnect::broken);
  CHECK(all<out::Restart>(job.advance(10s, {2})).empty());  // past the loss grace: still a member
  CHECK(job.rdzv.members() == 2);
  auto dead = job.advance(6s, {2});
  REQUIRE(all<out::Restart>(dead).size() == 1);
  CHECK(job.rdzv.counters().lost_to_silence == 1);
}

TEST_CASE("a failure reported while a peer's connection is down waits, and the peer's loss makes it its consequence",
          "[rdzv][loss]") {
  // --max-restarts=0: counted, the failure would end the job.
  Job job(settings(1, 3, 0));
  job.join(1, "n1");
  job.join(2, "n2");
  job.join(3, "n3");
  REQUIRE(job.rdzv.state() == State::running);
  job.rdzv.disconnected(3, job.now, Disconnect::closed_by_peer);
  // The survivors' workers fail on the broken collective.
  auto held = job.quiet(job.rdzv.workers_failed(1, 0, failure_of(0), job.now));
  CHECK(held.empty());
  CHECK(job.rdzv.state() == State::running);
  CHECK(job.rdzv.counters().failures_held == 1);
  CHECK(job.quiet(job.rdzv.workers_failed(2, 0, failure_of(1), job.now)).empty());  // held too: the first one counts
  auto lost = job.advance(kLossGrace + 1s, {3});
  auto restarts = all<out::Restart>(lost);
  REQUIRE(restarts.size() == 2);  // n1 and n2
  CHECK_FALSE(restarts[0].counts_as_failure);
  CHECK(reason_has(restarts, "node n3 (n3.cluster) closed its connection without leaving"));
  CHECK(reason_has(restarts, "the failure of node n1's workers after it (rank 0, exit code 1) is its consequence, "
                             "not counted"));
  CHECK(all<out::Finished>(lost).empty());  // the job goes on
  CHECK(job.rdzv.restart_count() == 0);
  // The survivors re-form a round of two.
  job.join(1, "n1");
  auto again = job.join(2, "n2");
  job.advance(31s);
  CHECK(job.rdzv.state() == State::running);
  CHECK(job.rdzv.round() == 1);
}

TEST_CASE("a failure held for a peer whose heartbeat was overdue counts once the peer is heard again",
          "[rdzv][loss]") {
  Job job(settings(2, 2, 1));
  job.join(1, "n1");
  job.join(2, "n2");
  REQUIRE(job.rdzv.state() == State::running);
  job.advance(8s, {2});  // n2 silent for 8 s: overdue (5 s x 1.5), not dead (15 s)
  auto held = job.quiet(job.rdzv.workers_failed(1, 0, failure_of(0), job.now));
  CHECK(all<out::Restart>(held).empty());
  // n2 is heard: n1's failure is one, counted against --max-restarts.
  auto released = job.quiet(job.rdzv.heartbeat(2, job.now));
  auto restarts = all<out::Restart>(released);
  REQUIRE(restarts.size() == 2);
  CHECK(restarts[0].counts_as_failure);
  CHECK(reason_has(restarts, "the workers of node n1 failed (rank 0, exit code 1)"));
  CHECK(job.rdzv.restart_count() == 1);
}

TEST_CASE("a failure held for a peer that resumes counts, and with no restarts left closes the job naming it",
          "[rdzv][loss]") {
  Job job(settings(2, 2, 0));
  job.join(1, "n1");
  auto assigns = all<out::Assign>(job.join(2, "n2"));
  job.rdzv.disconnected(2, job.now, Disconnect::broken);
  CHECK(job.quiet(job.rdzv.workers_failed(1, 0, failure_of(0), job.now)).empty());
  auto back = job.rdzv.join(8, resume_request("n2", assign_of(assigns, 2)), job.now);
  auto finished = all<out::Finished>(back);
  REQUIRE(finished.size() == 2);
  CHECK_FALSE(finished[0].success);
  REQUIRE(finished[0].root_cause);
  CHECK(finished[0].root_cause->global_rank == 0);
  CHECK(job.rdzv.state() == State::closed);
}

TEST_CASE("a held failure released by the peer's own failure report is acted on once, and its orders are sent",
          "[rdzv][loss]") {
  Job job(settings(2, 2, 0));
  job.join(1, "n1");
  auto assigns = all<out::Assign>(job.join(2, "n2"));
  job.rdzv.disconnected(2, job.now, Disconnect::broken);
  CHECK(job.quiet(job.rdzv.workers_failed(1, 0, failure_of(0), job.now)).empty());  // held for n2
  // n2 comes back saying its workers failed too: the first failure (n1's) ends the job, and everyone is told.
  JoinRequest back = resume_request("n2", assign_of(assigns, 2));
  back.resume->outcome = Resume::Outcome::failed;
  back.resume->failure = failure_of(1);
  auto out = job.rdzv.join(9, back, job.now);
  auto finished = all<out::Finished>(out);
  REQUIRE(finished.size() == 2);
  REQUIRE(finished[0].root_cause);
  CHECK(finished[0].root_cause->global_rank == 0);
  CHECK(job.rdzv.state() == State::closed);
}

TEST_CASE("a held failure released by a success report of the peer is acted on", "[rdzv][loss]") {
  Job job(settings(2, 2, 1));
  job.join(1, "n1");
  job.join(2, "n2");
  job.advance(8s, {2});  // n2 overdue
  CHECK(job.quiet(job.rdzv.workers_failed(1, 0, failure_of(0), job.now)).empty());
  auto out = job.quiet(job.rdzv.workers_succeeded(2, 0, job.now));
  auto restarts = all<out::Restart>(out);
  REQUIRE(restarts.size() == 2);
  CHECK(restarts[0].counts_as_failure);
  CHECK(job.rdzv.round() == 1);
}

// --- Bad nodes excluded ------------------------------------------------------

namespace {

Settings exclusion_settings(int min, int max, int restarts, int exclude_after) {
  Settings s = settings(min, max, restarts);
  s.exclude_after = exclude_after;
  s.exclude_cooldown = 60s;
  return s;
}

// A failure of `rank` that happened at `at_ms` (wall clock).
FailureInfo failed_at(int rank, long long at_ms, bool exclude = false) {
  FailureInfo f{rank, 0, 1, "host", "worker failed", at_ms / 1000, 100 + rank};
  f.failed_at_ms = at_ms;
  f.exclude_node = exclude;
  return f;
}

std::vector<out::Fenced> exclusions_in(const std::vector<Output>& outs) {
  std::vector<out::Fenced> v;
  for (const auto& f : all<out::Fenced>(outs)) {
    if (f.excluded_for) v.push_back(f);
  }
  return v;
}

// A plain join whose log lines are kept.
std::vector<Output> loud_join(Job& job, MemberId id, const std::string& name, bool host = false) {
  JoinRequest r;
  r.node_name = name;
  r.address = name + ".cluster";
  r.store_port = 40000;
  r.is_host = host;
  return job.rdzv.join(id, r, job.now);
}

bool log_has(const std::vector<Output>& outs, const std::string& text) {
  for (const auto& l : all<out::Log>(outs)) {
    if (l.text.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("a node that is the root cause of exclude_after attempts in a row is excluded, and a spare takes its place",
          "[rdzv][exclude]") {
  Job job(exclusion_settings(2, 2, 5, 2));
  job.join(1, "good");
  job.join(2, "bad");
  REQUIRE(job.rdzv.state() == State::running);
  job.join(3, "spare");  // beyond max: waits
  CHECK(job.rdzv.waiting() == 1);

  // Attempt 0: bad fails; good's report (its workers broke after) comes first.
  auto first = job.rdzv.workers_failed(1, 0, failed_at(0, 10'500), job.now);
  CHECK(all<out::Restart>(first).size() == 2);
  auto late = job.rdzv.workers_failed(2, 0, failed_at(1, 10'000), job.now);
  CHECK(log_has(late, "the workers of node bad failed first"));
  CHECK(exclusions_in(late).empty());  // one attempt: not yet
  // The spare stepped in; bad rejoins first and takes the other place.
  job.join(2, "bad");
  auto round1 = all<out::Assign>(job.join(1, "good"));
  CHECK(round1.empty());  // the round was full with spare and bad: good waits
  REQUIRE(job.rdzv.state() == State::running);

  // Attempt 1: bad fails again, alone: the verdict waits for the spare's
  // report or rejoin, then excludes bad.
  auto second = job.rdzv.workers_failed(2, 1, failed_at(1, 20'000), job.now);
  CHECK(exclusions_in(second).empty());
  CHECK(job.rdzv.restart_count() == 2);
  auto back = job.join(3, "spare");
  // good (waiting) and spare form the round; bad is out.
  auto fenced = exclusions_in(back);
  REQUIRE(fenced.size() == 1);
  CHECK(fenced[0].member == 2);
  CHECK(*fenced[0].excluded_for == 60s);
  CHECK(fenced[0].reason.find("root cause of 2 failed attempts in a row (exclude_after=2)") != std::string::npos);
  CHECK(all<out::Assign>(back).size() == 2);
  CHECK(job.rdzv.state() == State::running);
  // bad stays a member, parked: it hears how the job ends; it is not in the round.
  CHECK(job.rdzv.members() == 3);
  CHECK(job.rdzv.participants() == 2);
  CHECK_FALSE(job.rdzv.progress(2, job.now));  // its agent waits out the cooldown itself
  CHECK(job.rdzv.counters().excluded == 1);
  auto view = job.rdzv.view(job.now);
  REQUIRE(view.exclusions.size() == 1);
  CHECK(view.exclusions[0].address == "bad.cluster");
  CHECK(view.exclusions[0].count == 1);
  CHECK(view.exclusions[0].left == 60s);

  // Within its cooldown the address is parked, whatever agent joins from it.
  job.agents.erase(2);
  job.advance(10s);
  auto parked = job.join(7, "bad-restarted", 1, "bad.cluster");
  CHECK(all<out::Assign>(parked).empty());
  auto parked_view = job.rdzv.view(job.now);
  bool seen = false;
  for (const auto& m : parked_view.members) {
    if (m.node_name == "bad-restarted") {
      seen = true;
      REQUIRE(m.parked_for);
      CHECK(*m.parked_for == 50s);
    }
  }
  CHECK(seen);
  CHECK(job.rdzv.progress(7, job.now));
  // Once the cooldown is over it is a spare: the round is full, it waits.
  job.advance(51s);
  CHECK(job.rdzv.waiting() == 1);
  CHECK(job.rdzv.state() == State::running);
  CHECK(job.rdzv.round() == 2);

  // Excluded again later: the cooldown doubles.
  job.rdzv.workers_failed(1, 2, failed_at(0, 90'000, true), job.now);
  auto again = job.advance(6s);  // the verdict's settle time passes
  auto second_exclusion = exclusions_in(again);
  REQUIRE(second_exclusion.size() == 1);
  CHECK(second_exclusion[0].member == 1);
  CHECK(*second_exclusion[0].excluded_for == 60s);  // good's first
  CHECK(second_exclusion[0].reason.find("--exclude-exit-code") != std::string::npos);
}

TEST_CASE("a node back from its exclusion waits as a spare and does not stop a running round", "[rdzv][exclude]") {
  Job job(exclusion_settings(1, 2, 5, 0));
  job.join(1, "good");
  job.join(2, "bad");
  job.rdzv.workers_failed(2, 0, failed_at(1, 1000, true), job.now);
  auto out = job.join(1, "good");  // the verdict: bad excluded (good remains, min 1)
  REQUIRE(exclusions_in(out).size() == 1);
  job.agents.erase(2);
  job.advance(31s);  // good alone: the round closes at last call
  REQUIRE(job.rdzv.state() == State::running);
  int round = job.rdzv.round();
  job.advance(30s);  // past the 60 s cooldown
  auto back = job.join(2, "bad");
  CHECK(all<out::Restart>(back).empty());
  CHECK(job.rdzv.round() == round);
  CHECK(job.rdzv.waiting() == 1);
  // The next re-form (a failure of good) takes it in again.
  auto again = job.rdzv.workers_failed(1, round, failed_at(0, 70'000), job.now);
  CHECK(all<out::Restart>(again).size() == 1);
  auto formed = job.join(1, "good");
  CHECK(all<out::Assign>(formed).size() == 2);
}

TEST_CASE("another node's root cause breaks the streak", "[rdzv][exclude]") {
  Job job(exclusion_settings(1, 3, 5, 2));
  job.join(1, "a");
  job.join(2, "b");
  job.join(3, "c");
  auto fail_and_rejoin = [&](MemberId who, int round) {
    auto out = job.rdzv.workers_failed(who, round, failed_at(0, 1000 * (round + 1)), job.now);
    for (MemberId id : {1, 2, 3}) {
      auto more = job.join(id, std::string(1, static_cast<char>('a' + id - 1)));
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  };
  CHECK(exclusions_in(fail_and_rejoin(2, 0)).empty());
  CHECK(exclusions_in(fail_and_rejoin(1, 1)).empty());
  CHECK(exclusions_in(fail_and_rejoin(2, 2)).empty());
  auto out = fail_and_rejoin(2, 3);  // b twice in a row now
  auto ex = exclusions_in(out);
  REQUIRE(ex.size() == 1);
  CHECK(ex[0].member == 2);
  CHECK(job.rdzv.restart_count() == 4);
}

TEST_CASE("a node is never excluded where the job would end without it", "[rdzv][exclude]") {
  SECTION("fewer than min nodes would remain") {
    Job job(exclusion_settings(2, 2, 5, 1));
    job.join(1, "a");
    job.join(2, "b");
    auto out = job.rdzv.workers_failed(2, 0, failed_at(0, 1000), job.now);
    auto more = loud_join(job, 1, "a");
    out.insert(out.end(), more.begin(), more.end());
    CHECK(exclusions_in(out).empty());
    CHECK(log_has(out, "node b (b.cluster) is not excluded although it was the root cause of 1 failed attempts in a row"));
    CHECK(log_has(out, "fewer than --nnodes' minimum of 2"));
    CHECK(job.rdzv.members() == 2);
    CHECK(job.rdzv.counters().excluded == 0);
  }
  SECTION("it hosts the rendezvous") {
    Job job(exclusion_settings(1, 2, 5, 1));
    job.join(1, "host", 1, "", true);
    job.join(2, "b");
    auto out = job.rdzv.workers_failed(1, 0, failed_at(0, 1000, true), job.now);
    auto more = loud_join(job, 2, "b");
    out.insert(out.end(), more.begin(), more.end());
    CHECK(exclusions_in(out).empty());
    CHECK(log_has(out, "it hosts the rendezvous"));
  }
  SECTION("static ranks") {
    Settings s = exclusion_settings(2, 2, 5, 1);
    s.static_ranks = true;
    Job job(s);
    job.join(1, "a", 1, "", false, 0);
    job.join(2, "b", 1, "", false, 1);
    auto out = job.rdzv.workers_failed(2, 0, failed_at(0, 1000), job.now);
    auto more = job.advance(6s);
    out.insert(out.end(), more.begin(), more.end());
    CHECK(exclusions_in(out).empty());
    CHECK(job.rdzv.counters().excluded == 0);
  }
}

TEST_CASE("without exclude_after, a failure that asks for it excludes its node at once", "[rdzv][exclude]") {
  Job job(exclusion_settings(1, 2, 3, 0));
  job.join(1, "a");
  job.join(2, "b");
  job.advance(31s);
  auto out = job.rdzv.workers_failed(1, 0, failed_at(0, 5000), job.now);
  // b's workers failed later, but a's asked for its node to go: a is the root.
  auto late = job.rdzv.workers_failed(2, 0, failed_at(1, 6000, true), job.now);
  out.insert(out.end(), late.begin(), late.end());
  auto ex = exclusions_in(out);
  REQUIRE(ex.size() == 1);
  CHECK(ex[0].member == 2);
  CHECK(job.rdzv.restart_count() == 1);
  job.join(1, "a");
  CHECK(job.rdzv.participants() == 1);
  // The job ends while b waits out its cooldown: b hears it too.
  job.advance(31s);  // a alone: the round closes at last call
  REQUIRE(job.rdzv.state() == State::running);
  auto done = job.rdzv.workers_succeeded(1, job.rdzv.round(), job.now);
  auto told = all<out::Finished>(done);
  REQUIRE(told.size() == 2);
  CHECK(told[1].member == 2);
  CHECK(told[1].success);  // it stepped aside: the job succeeded for it too
  CHECK(told[1].message == "the job succeeded without this node, which was excluded");
}

TEST_CASE("every node gives the same exclusion settings", "[rdzv][exclude]") {
  Rendezvous r(exclusion_settings(1, 2, 0, 2));
  CHECK(r.accepts_settings("j", exclusion_settings(1, 2, 0, 2)).ok());
  auto st = r.accepts_settings("j", exclusion_settings(1, 2, 0, 3));
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("exclude_after=2") != std::string::npos);
  CHECK(st.message().find("give every node the same values") != std::string::npos);
}

// --- Stacks of a hung job ----------------------------------------------------

TEST_CASE("a hung rank has the other nodes that can take their stacks, and musterctl asks every node", "[rdzv][stacks]") {
  Job job(settings(3, 3));
  auto joiner = [&](MemberId id, const std::string& name, bool can) {
    JoinRequest r;
    r.node_name = name;
    r.address = name + ".cluster";
    r.store_port = 40000;
    if (can) r.features = {kFeatureStacks};
    job.agents.insert(id);
    return job.rdzv.join(id, r, job.now);
  };
  joiner(1, "a", true);
  joiner(2, "old", false);  // an agent of an older release: never sent a message it does not know
  auto formed = all<out::Assign>(joiner(3, "c", true));
  REQUIRE(formed.size() == 3);
  for (const auto& a : formed) CHECK(a.features == std::vector<std::string>{kFeatureStacks});

  auto hung = job.rdzv.worker_hung(3, 0, 2, job.now);
  auto orders = all<out::DumpStacks>(hung);
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].member == 1);
  CHECK(orders[0].reason == "rank 2 on node c was taken for hung");
  CHECK(log_has(hung, "1 other node of round 0 take their workers' stacks"));
  // A report about another round changes nothing, and the round's next hung rank (every
  // node's watchdog fires in a collective hang) asks nobody again.
  CHECK(all<out::DumpStacks>(job.rdzv.worker_hung(3, 7, 2, job.now)).empty());
  CHECK(all<out::DumpStacks>(job.rdzv.worker_hung(1, 0, 0, job.now)).empty());

  std::size_t unable = 0;
  auto asked = job.rdzv.request_stacks("musterctl", unable);
  CHECK(all<out::DumpStacks>(asked).size() == 2);
  CHECK(unable == 1);
  CHECK(all<out::DumpStacks>(asked)[0].reason == "asked by musterctl");
}

// --- A rendezvous that fell behind -------------------------------------------

TEST_CASE("silence while the rendezvous could not read is forgiven, at most the dead-after window each",
          "[rdzv][lag]") {
  Job job(settings(2, 2));  // dead after 15 s
  job.join(1, "a");
  job.join(2, "b");
  REQUIRE(job.rdzv.state() == State::running);
  // The loop stalls 14 s: nobody's heartbeat is read. Then it is 6 s late for its timer.
  job.now += 20s;
  job.rdzv.forgive(6s, job.now);
  auto out = job.rdzv.tick(job.now);
  CHECK(all<out::Restart>(out).empty());  // 20 s silent, 6 forgiven: within the window
  CHECK(job.rdzv.members() == 2);
  // Heard again: the forgiveness starts afresh.
  job.rdzv.heartbeat(1, job.now);
  job.rdzv.heartbeat(2, job.now);
  // A member that really died is still found, however far behind the loop stays:
  // b is silent from here; every tick is late by 10 s.
  for (int i = 0; i < 4; ++i) {
    job.now += 10s;
    job.rdzv.heartbeat(1, job.now);
    job.rdzv.forgive(10s, job.now);
    job.rdzv.tick(job.now);
  }
  // 40 s of b's silence, 15 s of it forgiven at most: b is gone.
  CHECK(job.rdzv.members() == 1);
  CHECK(job.rdzv.counters().lost_to_silence == 1);
}

TEST_CASE("the excluded agent's own join in flight leaves it parked until it joins after the cooldown",
          "[rdzv][exclude]") {
  Job job(exclusion_settings(1, 2, 5, 0));
  auto joiner = [&](MemberId id, const std::string& name) {
    JoinRequest r;
    r.node_name = name;
    r.address = name + ".cluster";
    r.store_port = 40000;
    r.features = {kFeatureStacks, kFeatureExclude};
    job.agents.insert(id);
    return job.rdzv.join(id, r, job.now);
  };
  joiner(1, "good");
  joiner(2, "bad");
  job.rdzv.workers_failed(2, 0, failed_at(1, 1000, true), job.now);
  // bad's rejoin crosses its exclusion on the wire: it is parked, and stays parked past the
  // cooldown until its agent joins again (never taken in behind its back).
  auto first = joiner(1, "good");
  REQUIRE(exclusions_in(first).size() == 1);
  auto crossed = joiner(2, "bad");
  CHECK(all<out::Assign>(crossed).empty());
  job.advance(31s);  // good runs alone
  REQUIRE(job.rdzv.state() == State::running);
  // A failure of good re-forms the job during bad's cooldown: bad's deadline still runs from
  // the cooldown's end, so it is not turned away meanwhile.
  job.rdzv.workers_failed(1, job.rdzv.round(), failed_at(0, 40'000), job.now);
  joiner(1, "good");
  auto later = job.advance(40s);  // past the 60 s cooldown
  CHECK(all<out::Reject>(later).empty());
  CHECK(job.rdzv.waiting() == 0);
  CHECK(job.rdzv.members() == 2);
  // Its agent joins after the cooldown: a spare now (the round runs on good).
  joiner(2, "bad");
  CHECK(job.rdzv.waiting() == 1);
}

TEST_CASE("nodes on the excluded node's own address do not count as the ones that remain", "[rdzv][exclude]") {
  Job job(exclusion_settings(2, 3, 5, 1));
  job.join(1, "a", 1, "host-a");
  job.join(2, "b1", 1, "host-b");
  job.join(3, "b2", 1, "host-b");  // a second agent on the same machine
  REQUIRE(job.rdzv.state() == State::running);
  auto out = job.rdzv.workers_failed(2, 0, failed_at(1, 1000), job.now);
  auto more = job.advance(6s);  // the verdict's settle time
  out.insert(out.end(), more.begin(), more.end());
  CHECK(exclusions_in(out).empty());  // without host-b only a remains, below min 2
  CHECK(job.rdzv.counters().excluded == 0);
}
