// RendezvousMember's contract (rendezvous_member.hpp), against a real
// rendezvous server and against a fake one that stops answering. Each node
// is a member and an AgentCore wired as the agent wires them; its "workers"
// are the core's bookkeeping, ending as each test says.
#include <catch2/catch.hpp>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <csignal>
#include <functional>
#include <map>
#include <memory>

#include "launch_config.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "muster/rendezvous/server.hpp"
#include "rendezvous_member.hpp"

using namespace muster;
using namespace muster::launcher;
using boost::asio::ip::tcp;
using nlohmann::json;

namespace {

// Every wait below ends on what it waits for; this only bounds a broken one.
constexpr auto kBound = std::chrono::seconds(60);

MemberSettings settings(int nodes, int max_restarts, std::chrono::milliseconds keep_alive, int attempts,
                        std::chrono::milliseconds reconnect) {
  MemberSettings s;
  s.rdzv.min_nodes = s.rdzv.max_nodes = nodes;
  s.rdzv.max_restarts = max_restarts;
  s.rdzv.join_timeout = std::chrono::seconds(60);
  s.rdzv.last_call_timeout = std::chrono::milliseconds(100);
  s.rdzv.keep_alive_interval = keep_alive;
  s.rdzv.keep_alive_max_attempt = attempts;
  s.reconnect_timeout = std::max(reconnect, s.rdzv.dead_after());
  return s;
}

// Moves every member's clock on by d (MemberClock) and wakes the loop, so
// the member's timers that are due by then fire now: Asio recomputes its wait
// whenever a timer is set. Called from a handler, on the loop's thread.
void jump(boost::asio::io_context& io, MemberClock::duration d) {
  MemberClock::advance(d);
  auto poke = std::make_shared<MemberTimer>(io);
  poke->expires_after(std::chrono::milliseconds(0));
  poke->async_wait([poke](const boost::system::error_code&) {});
}

// One node: a member and the core it reports to, one worker.
struct Node {
  // How the worker of attempt N ends once started; nullopt: it runs until signalled.
  using Script = std::function<std::optional<ExitStatus>(int attempt)>;

  Node(boost::asio::io_context& io, int port, const std::string& name, MemberSettings s, Script script)
      : io(io), core(1, s.rdzv.max_restarts, true), script(std::move(script)) {
    MemberIdentity id;
    id.job = "job";
    id.role = "trainer";
    id.address = name;
    id.local_world_size = 1;
    RendezvousMember::Events ev;
    ev.assigned = [this](const rendezvous::out::Assign& a) {
      assigned.push_back(a);
      apply(core.on_assignment(a.restart_count));
      if (on_assigned) on_assigned();
    };
    ev.restart = [this](bool counts_as_failure) {
      ++restarts;
      apply(core.on_restart_order(counts_as_failure));
    };
    ev.finish = [this](int code, const std::optional<rendezvous::FailureInfo>& root) {
      root_cause = root;
      apply(core.on_finish_order(code));
    };
    ev.fenced = [this] {
      ++fenced;
      apply(core.on_fenced());
    };
    ev.failed = [this](const Status& st) {
      failed = st;
      apply(core.on_rendezvous_lost());
      if (!finished && !core.holds_workers()) apply(core.on_finish_order(1));
    };
    ev.round_store = [] { return Result<int>(4242); };
    member = std::make_unique<RendezvousMember>(io, "127.0.0.1", port, std::move(s), std::move(id), std::nullopt,
                                                core, std::move(ev));
  }

  void apply(const std::vector<Action>& actions) {
    for (const auto& a : actions) {
      if (finished) return;
      if (std::holds_alternative<action::StartWorkers>(a)) {
        auto end = script(attempts++);
        if (end) boost::asio::post(io, [this, e = *end] { apply(core.on_worker_exit(0, e)); });
      } else if (const auto* s = std::get_if<action::SignalWorkers>(&a)) {
        ++signalled;
        boost::asio::post(io, [this, signo = s->signo] { apply(core.on_worker_exit(0, ExitStatus{true, signo})); });
      } else if (std::holds_alternative<action::ReportFailure>(a)) {
        rendezvous::FailureInfo f;
        f.host = "host";
        f.exitcode = 3;
        f.message = "worker failed";
        member->report_failure(f);
      } else if (std::holds_alternative<action::ReportSuccess>(a)) {
        member->report_success();
      } else if (std::holds_alternative<action::Rejoin>(a)) {
        member->rejoin();
      } else if (const auto* f = std::get_if<action::Finish>(&a)) {
        finished = f->exit_code;
        member->leave();
        if (on_finished) on_finished();
      }
    }
  }

  boost::asio::io_context& io;
  AgentCore core;
  Script script;
  std::unique_ptr<RendezvousMember> member;
  std::vector<rendezvous::out::Assign> assigned;
  int attempts = 0;
  int restarts = 0;
  int fenced = 0;
  int signalled = 0;
  std::optional<int> finished;
  std::optional<Status> failed;
  std::function<void()> on_assigned;
  std::optional<rendezvous::FailureInfo> root_cause;
  std::function<void()> on_finished;
};

ExitStatus exits(int code) { return {false, code}; }

// A rendezvous whose answers the test scripts: on_message(connection, message)
// for every message of every connection (numbered from 0 in accept order);
// heartbeats are never acknowledged. Records each connection's first message.
struct FakeServer {
  struct Conn {
    explicit Conn(tcp::socket s) : socket(std::move(s)) {}
    tcp::socket socket;
    rendezvous::FrameReader reader;
    char buf[4096];
    std::optional<json> first;
  };

  explicit FakeServer(boost::asio::io_context& io) : acceptor(io, tcp::endpoint(tcp::v4(), 0)) { accept(); }
  int port() const { return acceptor.local_endpoint().port(); }

  void send(std::size_t conn, const rendezvous::Output& o) {
    auto bytes = std::make_shared<std::string>(rendezvous::encode_frame(rendezvous::to_json(o)));
    boost::asio::async_write(conns[conn]->socket, boost::asio::buffer(*bytes),
                             [bytes](const boost::system::error_code&, std::size_t) {});
  }
  void drop(std::size_t conn) {
    boost::system::error_code ignored;
    conns[conn]->socket.shutdown(tcp::socket::shutdown_both, ignored);
    conns[conn]->socket.close(ignored);
  }

  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket s) {
      if (ec) return;
      conns.push_back(std::make_shared<Conn>(std::move(s)));
      read(conns.size() - 1);
      accept();
    });
  }

  void read(std::size_t index) {
    auto c = conns[index];
    c->socket.async_read_some(boost::asio::buffer(c->buf), [this, c, index](const boost::system::error_code& ec,
                                                                            std::size_t n) {
      if (ec) return;
      c->reader.feed(std::string_view(c->buf, n));
      for (;;) {
        auto frame = c->reader.next();
        if (!frame.ok() || !frame.value()) break;
        auto m = rendezvous::parse_message(*frame.value());
        if (!m.ok()) break;
        if (!c->first) {
          c->first = m.value();
          firsts.push_back(m.value());
        }
        if (on_message) on_message(index, m.value());
      }
      read(index);
    });
  }

  static rendezvous::out::Assign assignment() {
    rendezvous::out::Assign a;
    a.group_world_size = 1;
    a.ranks.global_world_size = 1;
    a.ranks.role_world_size = 1;
    a.master_addr = "127.0.0.1";
    a.master_port = 4242;
    return a;
  }

  tcp::acceptor acceptor;
  std::vector<std::shared_ptr<Conn>> conns;
  std::vector<json> firsts;
  std::function<void(std::size_t conn, const json& message)> on_message;
};

}  // namespace

TEST_CASE("member: two nodes are assigned one round, with ranks of their own, and finish with 0 together",
          "[member]") {
  boost::asio::io_context io;
  auto server = rendezvous::RendezvousServer::listen(io, "127.0.0.1", 0);
  REQUIRE(server.ok());
  auto s = settings(2, 0, std::chrono::seconds(1), 3, std::chrono::seconds(10));
  auto succeed = [](int) { return std::optional<ExitStatus>(exits(0)); };
  Node a(io, server.value()->port(), "10.0.0.1", s, succeed);
  Node b(io, server.value()->port(), "10.0.0.2", s, succeed);
  auto both_done = [&] {
    if (a.finished && b.finished) io.stop();
  };
  a.on_finished = b.on_finished = both_done;
  a.member->start();
  b.member->start();
  io.run_for(kBound);
  REQUIRE(a.assigned.size() == 1);
  REQUIRE(b.assigned.size() == 1);
  CHECK(a.assigned[0].round == b.assigned[0].round);
  CHECK(a.assigned[0].group_world_size == 2);
  CHECK(a.assigned[0].group_rank + b.assigned[0].group_rank == 1);  // 0 and 1
  CHECK(a.assigned[0].ranks.global_world_size == 2);
  CHECK(a.assigned[0].master_port == 4242);  // the round store of group rank 0
  CHECK(a.member->round() == a.assigned[0].round);
  CHECK(a.finished == 0);
  CHECK(b.finished == 0);
  CHECK_FALSE(a.failed);
  CHECK_FALSE(b.failed);
  CHECK(a.member->name().rfind("10.0.0.1_", 0) == 0);
  CHECK(a.member->name().size() == std::string("10.0.0.1_").size() + 32);
  CHECK(a.member->name() != Node(io, 1, "10.0.0.1", s, succeed).member->name());
  server.value()->close();
}

TEST_CASE("member: one node's failure re-forms the job, and both rejoin the next round, which succeeds", "[member]") {
  boost::asio::io_context io;
  auto server = rendezvous::RendezvousServer::listen(io, "127.0.0.1", 0);
  REQUIRE(server.ok());
  auto s = settings(2, 1, std::chrono::seconds(1), 3, std::chrono::seconds(10));
  // a's first worker fails; b's runs until stopped. Their second ones succeed.
  Node a(io, server.value()->port(), "10.0.0.1", s,
         [](int attempt) { return std::optional<ExitStatus>(exits(attempt == 0 ? 3 : 0)); });
  Node b(io, server.value()->port(), "10.0.0.2", s,
         [](int attempt) { return attempt == 0 ? std::nullopt : std::optional<ExitStatus>(exits(0)); });
  a.on_finished = b.on_finished = [&] {
    if (a.finished && b.finished) io.stop();
  };
  a.member->start();
  b.member->start();
  io.run_for(kBound);
  REQUIRE(a.assigned.size() == 2);
  REQUIRE(b.assigned.size() == 2);
  CHECK(a.assigned[1].round > a.assigned[0].round);
  CHECK(a.assigned[1].round == b.assigned[1].round);
  CHECK(a.assigned[1].restart_count == 1);
  CHECK(b.assigned[1].restart_count == 1);
  CHECK(b.restarts == 1);
  CHECK(b.signalled == 1);  // its running worker was stopped for the new round
  CHECK(a.signalled == 0);
  CHECK(a.finished == 0);
  CHECK(b.finished == 0);
  server.value()->close();
}

TEST_CASE("member: a node that steps out leaves at once, uncounted, and joins again as a newcomer", "[member]") {
  boost::asio::io_context io;
  auto server = rendezvous::RendezvousServer::listen(io, "127.0.0.1", 0);
  REQUIRE(server.ok());
  // --nnodes=1:2, no restart allowed: a departure that counted would end the job.
  auto s = settings(2, 0, std::chrono::seconds(1), 3, std::chrono::seconds(10));
  s.rdzv.min_nodes = 1;
  // Workers run until stopped until b has stepped out; after that they succeed.
  bool stepped = false;
  auto script = [&stepped](int) { return stepped ? std::optional<ExitStatus>(exits(0)) : std::nullopt; };
  Node a(io, server.value()->port(), "10.0.0.1", s, script);
  Node b(io, server.value()->port(), "10.0.0.2", s, script);
  // b steps out once a round runs on both (as on a failed health check), and
  // rejoins at once (its check passing again).
  auto step_out_when_both_run = [&] {
    if (stepped || a.assigned.empty() || b.assigned.empty()) return;
    const auto& ra = a.assigned.back();
    if (ra.round != b.assigned.back().round || ra.group_world_size != 2) return;
    stepped = true;
    boost::asio::post(io, [&] { b.member->step_out("its health check failed"); });
  };
  a.on_assigned = b.on_assigned = step_out_when_both_run;
  a.on_finished = b.on_finished = [&] {
    if (a.finished && b.finished) io.stop();
  };
  a.member->start();
  b.member->start();
  io.run_for(kBound);
  CHECK(b.fenced == 1);
  CHECK(b.signalled == 1);  // its workers stopped
  CHECK(a.restarts >= 1);   // the others re-formed without it...
  REQUIRE_FALSE(a.assigned.empty());
  REQUIRE_FALSE(b.assigned.empty());
  CHECK(a.assigned.back().restart_count == 0);  // ...uncounted
  CHECK(a.assigned.back().group_world_size == 2);  // and with it again
  CHECK(a.assigned.back().round == b.assigned.back().round);
  CHECK(a.finished == 0);
  CHECK(b.finished == 0);
  server.value()->close();
}

TEST_CASE("member: a job that fails past its restarts finishes with 1 and names the root cause", "[member]") {
  boost::asio::io_context io;
  auto server = rendezvous::RendezvousServer::listen(io, "127.0.0.1", 0);
  REQUIRE(server.ok());
  auto s = settings(2, 0, std::chrono::seconds(1), 3, std::chrono::seconds(10));
  Node a(io, server.value()->port(), "10.0.0.1", s, [](int) { return std::optional<ExitStatus>(exits(3)); });
  Node b(io, server.value()->port(), "10.0.0.2", s, [](int) { return std::optional<ExitStatus>(); });
  a.on_finished = b.on_finished = [&] {
    if (a.finished && b.finished) io.stop();
  };
  a.member->start();
  b.member->start();
  io.run_for(kBound);
  CHECK(a.finished == 1);
  CHECK(b.finished == 1);
  REQUIRE(b.root_cause);
  CHECK(b.root_cause->exitcode == 3);
  CHECK(b.root_cause->message == "worker failed");
  CHECK(b.signalled == 1);
  server.value()->close();
}

TEST_CASE("member: a lease that lapses while the workers run fences them, and the node joins again as a newcomer",
          "[member]") {
  boost::asio::io_context io;
  FakeServer fake(io);
  // Assigns on the first join, then says nothing more.
  fake.on_message = [&](std::size_t conn, const json& m) {
    if (conn == 0 && m["type"] == "join") fake.send(0, FakeServer::assignment());
    if (fake.firsts.size() == 2) io.stop();
  };
  // Dead after 2 x 10 s without an acknowledged heartbeat: the member's clock
  // jumps over the window once the workers run.
  Node n(io, fake.port(), "10.0.0.1", settings(1, 0, std::chrono::seconds(10), 2, std::chrono::seconds(60)),
         [](int) { return std::optional<ExitStatus>(); });
  n.on_assigned = [&] { boost::asio::post(io, [&] { jump(io, std::chrono::seconds(21)); }); };
  const auto started = std::chrono::steady_clock::now();
  n.member->start();
  io.run_for(kBound);
  CHECK(n.assigned.size() == 1);
  CHECK(n.fenced == 1);
  CHECK(n.signalled == 1);
  CHECK_FALSE(n.member->assigned());
  REQUIRE(fake.firsts.size() == 2);
  // The second connection joins afresh: no resume of the place it lost.
  auto rejoin = rendezvous::join_from_json(fake.firsts[1]);
  REQUIRE(rejoin.ok());
  CHECK_FALSE(rejoin->request.resume);
  CHECK_FALSE(n.finished);
  // Without waiting the window out in real time.
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(15));
}

TEST_CASE("member: a broken connection keeps the workers, and the node resumes its place, saying how they ended",
          "[member]") {
  boost::asio::io_context io;
  FakeServer fake(io);
  fake.on_message = [&](std::size_t conn, const json& m) {
    if (conn == 0 && m["type"] == "join") {
      rendezvous::out::Assign a = FakeServer::assignment();
      a.round = 3;
      fake.send(0, a);
    }
    // The first connection breaks as the node reports its workers' success.
    if (conn == 0 && m["type"] == "workers_succeeded") fake.drop(0);
    if (conn == 1 && m["type"] == "join") {
      fake.send(1, rendezvous::out::Resumed{0, 3});
      rendezvous::out::Finished f;
      f.success = true;
      fake.send(1, f);
    }
  };
  Node n(io, fake.port(), "10.0.0.1", settings(1, 0, std::chrono::seconds(1), 3, std::chrono::seconds(30)),
         [](int) { return std::optional<ExitStatus>(exits(0)); });
  n.on_finished = [&] { io.stop(); };
  n.member->start();
  io.run_for(kBound);
  REQUIRE(fake.firsts.size() == 2);
  auto first = rendezvous::join_from_json(fake.firsts[0]);
  auto again = rendezvous::join_from_json(fake.firsts[1]);
  REQUIRE(first.ok());
  REQUIRE(again.ok());
  CHECK_FALSE(first->request.resume);
  CHECK(first->request.store_port == 4242);  // from round_store
  REQUIRE(again->request.resume);
  CHECK(again->request.resume->round == 3);
  CHECK(again->request.resume->master_port == 4242);
  CHECK(again->request.resume->outcome == rendezvous::Resume::Outcome::succeeded);
  CHECK(again->request.store_port == 4242);
  CHECK(again->request.node_name == first->request.node_name);
  // Resumed, not re-formed: one assignment, nothing stopped, and the job's end is this node's.
  CHECK(n.assigned.size() == 1);
  CHECK(n.signalled == 0);
  CHECK(n.fenced == 0);
  CHECK(n.finished == 0);
}

TEST_CASE("member: a rendezvous that takes the join and never answers is given up after reconnect_timeout",
          "[member]") {
  boost::asio::io_context io;
  FakeServer fake(io);  // answers nothing, not even the join
  // reconnect_timeout 40 s, jumped over once the join is out.
  Node n(io, fake.port(), "10.0.0.1", settings(1, 0, std::chrono::seconds(1), 2, std::chrono::seconds(40)),
         [](int) { return std::optional<ExitStatus>(); });
  fake.on_message = [&](std::size_t, const json& m) {
    if (m["type"] == "join") jump(io, std::chrono::seconds(41));
  };
  n.on_finished = [&] { io.stop(); };
  const auto started = std::chrono::steady_clock::now();
  n.member->start();
  io.run_for(kBound);
  REQUIRE(n.failed);
  // (The message names the join that went unanswered since the fix for a port another program holds.)
  CHECK_THAT(n.failed->message(), Catch::Contains("has not answered the join of job 'job' for 4"));
  CHECK_THAT(n.failed->message(), Catch::Contains("something other than a muster rendezvous seems to hold that port"));
  CHECK_THAT(n.failed->message(), Catch::Contains("gave up after 40 s (--rdzv-conf reconnect_timeout)"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(20));
  CHECK(n.finished == 1);
  CHECK(n.assigned.empty());
}

TEST_CASE("member: a rendezvous gone for good past reconnect_timeout ends the job on this node, saying so",
          "[member]") {
  boost::asio::io_context io;
  auto server = rendezvous::RendezvousServer::listen(io, "127.0.0.1", 0);
  REQUIRE(server.ok());
  // Dead after 2 x 200 ms without an acknowledged heartbeat; reconnecting for 3 s
  // (the client gives up at its last backoff step that ends before then, ~1.5 s).
  Node n(io, server.value()->port(), "10.0.0.1", settings(1, 0, std::chrono::milliseconds(200), 2, std::chrono::seconds(3)),
         [](int) { return std::optional<ExitStatus>(); });
  n.on_finished = [&] { io.stop(); };
  n.member->start();
  // Once assigned, the rendezvous goes away.
  boost::asio::steady_timer poll(io);
  std::function<void()> wait_assigned = [&] {
    poll.expires_after(std::chrono::milliseconds(10));
    poll.async_wait([&](const boost::system::error_code& ec) {
      if (ec) return;
      if (n.assigned.empty()) return wait_assigned();
      server.value()->close();
      server.value().reset();
    });
  };
  wait_assigned();
  io.run_for(kBound);
  REQUIRE(n.assigned.size() == 1);
  REQUIRE(n.failed);
  CHECK_THAT(n.failed->message(), Catch::Contains("lost the rendezvous at 127.0.0.1:"));
  CHECK_THAT(n.failed->message(), Catch::Contains("could not reconnect within 3 s"));
  // The lease lapsed first (the window is shorter than the reconnect
  // window): the workers were stopped, and the join that followed never went out.
  CHECK(n.fenced == 1);
  CHECK(n.signalled == 1);
  CHECK(n.assigned.size() == 1);
  CHECK(n.finished == 1);
}

TEST_CASE("member: settings from the command line and --rdzv-conf", "[member]") {
  LaunchConfig cfg;
  cfg.min_nodes = 2;
  cfg.max_nodes = 4;
  cfg.max_restarts = 3;
  cfg.rdzv_backend = "c10d";
  // --rdzv-conf as the command line resolves it (cli/rdzv_conf.hpp), then the member's settings.
  auto member_settings = [&cfg](const RdzvConf& conf) -> muster::Result<MemberSettings> {
    std::vector<std::string> warnings;
    auto options = resolve_rendezvous_options(conf, cfg.rdzv_backend == "static", warnings);
    if (!options.ok()) return options.status();
    cfg.rdzv = options.value();
    return muster::launcher::member_settings(cfg);
  };
  auto s = member_settings({{"join_timeout", "12.5"}, {"keep_alive_interval", "2"}, {"keep_alive_max_attempt", "4"},
                            {"reconnect_timeout", "1"}});
  REQUIRE(s.ok());
  CHECK(s->rdzv.min_nodes == 2);
  CHECK(s->rdzv.max_nodes == 4);
  CHECK(s->rdzv.max_restarts == 3);
  CHECK(s->rdzv.join_timeout == std::chrono::milliseconds(12500));
  CHECK(s->rdzv.last_call_timeout == std::chrono::seconds(30));
  CHECK_FALSE(s->rdzv.static_ranks);
  // Never less than the dead-after window (2 s x 4).
  CHECK(s->reconnect_timeout == std::chrono::seconds(8));

  cfg.rdzv_backend = "static";
  s = member_settings({{"timeout", "7"}});
  REQUIRE(s.ok());
  CHECK(s->rdzv.static_ranks);
  CHECK(s->rdzv.min_nodes == 4);
  CHECK(s->rdzv.join_timeout == std::chrono::seconds(7));

  cfg.rdzv_backend = "c10d";
  CHECK_THAT(member_settings({{"last_call_timeout", "soon"}}).status().message(),
             Catch::Contains("'last_call_timeout' must be a number of seconds, got 'soon'"));
  CHECK_THAT(member_settings({{"keep_alive_max_attempt", "0"}}).status().message(),
             Catch::Contains("keep_alive_max_attempt in [1, "));
  CHECK_THAT(member_settings({{"join_timeout", "0"}}).status().message(),
             Catch::Contains("join_timeout must be more than 0"));
}
