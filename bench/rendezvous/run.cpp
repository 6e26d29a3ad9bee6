// bench/rendezvous: N simulated agents in this one process, each its own TCP
// connection on loopback, join one musterd (started here). Measures
//   1. formation: first connect -> the last agent holding its assignment;
//   2. loss by leave: one agent says `leave` and closes (as an agent that
//      exits does) -> the last survivor holding its restart order (a
//      connection that just breaks keeps its place for the dead-after window,
//      so it can resume: that loss is the silence one below);
//   3. loss by silence: one agent stops heartbeating -> the last survivor
//      holding its restart order, against keep_alive_interval x attempts.
// Counts the messages the daemon sent, to show they are O(N).
//   rendezvous_bench MUSTERD [N...]      (default N: 100 1000 10000)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <vector>

#include "muster/rendezvous/protocol.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using muster::rendezvous::FrameReader;
using muster::rendezvous::encode_frame;

namespace {

constexpr int kKeepAliveMs = 1000;
constexpr int kAttempts = 2;

struct Agent : std::enable_shared_from_this<Agent> {
  Agent(asio::io_context& io, int id) : socket(io), id(id) {}
  tcp::socket socket;
  int id;
  FrameReader reader;
  std::array<char, 4096> buf{};
  std::string type_seen;
  Clock::time_point when{};
  long messages = 0;
  bool silent = false;
  std::function<void(Agent&)> on_message;

  void send(const json& j) {
    auto bytes = std::make_shared<std::string>(encode_frame(j));
    asio::async_write(socket, asio::buffer(*bytes), [bytes](auto, auto) {});
  }
  // Says `leave`, then closes once it is written.
  void leave() {
    silent = true;
    auto self = shared_from_this();
    auto bytes = std::make_shared<std::string>(encode_frame({{"type", "leave"}, {"v", 1}}));
    asio::async_write(socket, asio::buffer(*bytes), [self, bytes](auto, auto) {
      boost::system::error_code ignored;
      self->socket.close(ignored);
    });
  }
  void read() {
    auto self = shared_from_this();
    socket.async_read_some(asio::buffer(buf), [self](boost::system::error_code ec, std::size_t n) {
      if (ec) return;
      self->reader.feed(std::string_view(self->buf.data(), n));
      while (true) {
        auto f = self->reader.next();
        if (!f.ok() || !f.value()) break;
        auto m = json::parse(*f.value());
        self->type_seen = m["type"];
        self->when = Clock::now();
        ++self->messages;
        if (self->on_message) self->on_message(*self);
      }
      self->read();
    });
  }
};

json join_message(int id, int n) {
  return {{"type", "join"},
          {"v", 1},
          {"job", "bench" + std::to_string(n)},
          {"node", "node" + std::to_string(id)},
          {"address", "10.0." + std::to_string(id / 250) + "." + std::to_string(id % 250)},
          {"local_world_size", 8},
          {"store_port", 29500},
          {"settings",
           {{"min_nodes", std::max(1, n - 2)},
            {"max_nodes", n},
            {"keep_alive_interval_ms", kKeepAliveMs},
            {"keep_alive_max_attempt", kAttempts},
            {"join_timeout_ms", 120000},
            {"last_call_timeout_ms", 1000}}}};
}

// Runs io until pred() or the deadline; returns whether pred() held.
template <typename Pred>
bool run_until(asio::io_context& io, Pred pred, std::chrono::seconds limit) {
  auto deadline = Clock::now() + limit;
  while (!pred() && Clock::now() < deadline) io.run_for(std::chrono::milliseconds(5));
  return pred();
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void bench(const std::string& host, int port, int n) {
  asio::io_context io(1);
  std::vector<std::shared_ptr<Agent>> agents;
  tcp::endpoint ep(asio::ip::make_address(host), static_cast<uint16_t>(port));
  auto t0 = Clock::now();
  int connected = 0;
  for (int i = 0; i < n; ++i) agents.push_back(std::make_shared<Agent>(io, i));
  // At most kInFlight connects at once: more would overflow the listen backlog
  // (net.core.somaxconn, 4096 here) and the kernel would retry dropped SYNs
  // after a full second, measuring the kernel's timer instead of musterd.
  constexpr int kInFlight = 1024;
  int next = 0;
  std::function<void()> connect_next = [&] {
    if (next >= n) return;
    auto a = agents[static_cast<std::size_t>(next++)];
    a->socket.async_connect(ep, [a, n, &connected, &connect_next](boost::system::error_code ec) {
      if (ec) {
        std::fprintf(stderr, "connect failed: %s\n", ec.message().c_str());
        return;
      }
      ++connected;
      a->socket.set_option(tcp::no_delay(true));
      a->read();
      a->send(join_message(a->id, n));
      connect_next();
    });
  };
  for (int i = 0; i < std::min(n, kInFlight); ++i) connect_next();
  auto assigned = [&] {
    for (auto& a : agents) if (a->type_seen != "assign") return false;
    return true;
  };
  if (!run_until(io, assigned, std::chrono::seconds(120))) {
    std::map<std::string, int> seen;
    for (auto& a : agents) seen[a->type_seen.empty() ? "(nothing)" : a->type_seen]++;
    std::printf("N=%d: formation did not complete (%d connected):", n, connected);
    for (auto& [t, c] : seen) std::printf(" %s=%d", t.c_str(), c);
    std::printf("\n");
    return;
  }
  Clock::time_point last{};
  for (auto& a : agents) last = std::max(last, a->when);
  double formation = ms_between(t0, last);
  long msgs = 0;
  for (auto& a : agents) msgs += a->messages;

  // Heartbeats from everyone but the silent one.
  asio::steady_timer beat(io);
  std::function<void()> heartbeat = [&] {
    for (auto& a : agents) if (!a->silent && a->socket.is_open()) a->send({{"type", "heartbeat"}, {"v", 1}});
    beat.expires_after(std::chrono::milliseconds(kKeepAliveMs / 2));
    beat.async_wait([&](boost::system::error_code ec) { if (!ec) heartbeat(); });
  };
  heartbeat();

  // 2. Loss by leave: agent 0 goes away.
  auto restarted = [&](std::size_t from) {
    return [&, from] {
      for (std::size_t i = from; i < agents.size(); ++i) if (agents[i]->type_seen != "restart") return false;
      return true;
    };
  };
  auto t_drop = Clock::now();
  agents[0]->leave();
  double drop_ms = -1;
  if (run_until(io, restarted(1), std::chrono::seconds(60))) {
    Clock::time_point l{};
    for (std::size_t i = 1; i < agents.size(); ++i) l = std::max(l, agents[i]->when);
    drop_ms = ms_between(t_drop, l);
  }
  // The survivors re-form (min is N-2), after the last call.
  for (std::size_t i = 1; i < agents.size(); ++i) {
    agents[i]->type_seen.clear();
    agents[i]->send(join_message(agents[i]->id, n));
  }
  auto reassigned = [&] {
    for (std::size_t i = 1; i < agents.size(); ++i) if (agents[i]->type_seen != "assign") return false;
    return true;
  };
  double silence_ms = -1;
  if (run_until(io, reassigned, std::chrono::seconds(60))) {
    // 3. Loss by silence: agent 1 stops heartbeating (its connection stays open).
    agents[1]->silent = true;
    auto t_silent = Clock::now();
    if (run_until(io, restarted(2), std::chrono::seconds(60))) {
      Clock::time_point l{};
      for (std::size_t i = 2; i < agents.size(); ++i) l = std::max(l, agents[i]->when);
      silence_ms = ms_between(t_silent, l);
    }
  }
  beat.cancel();
  std::printf("%-8d %14.1f %14ld %18.1f %20.1f %12d\n", n, formation, msgs, drop_ms, silence_ms,
              kKeepAliveMs * kAttempts);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: rendezvous_bench MUSTERD [N...]\n");
    return 2;
  }
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  std::vector<int> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {100, 1000, 10000};

  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    // musterd logs every join at INFO; thousands of lines to the console would
    // be measured with it.
    setenv("LOGLEVEL", "WARNING", 1);
    // Every simulated agent comes from 127.0.0.1: lift the per-address cap.
    execl(argv[1], argv[1], "--listen", "127.0.0.1:0", "--max-connections-per-peer", "1000000",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  char line[256] = {0};
  FILE* out = fdopen(fds[0], "r");
  if (!out || !fgets(line, sizeof line, out)) return 1;
  std::string l(line);
  int port = std::stoi(l.substr(l.rfind(':') + 1));
  std::printf("musterd on 127.0.0.1:%d; keep_alive_interval %d ms x %d attempts\n", port, kKeepAliveMs, kAttempts);
  std::printf("%-8s %14s %14s %18s %20s %12s\n", "agents", "formation_ms", "msgs_to_agents", "loss_by_leave_ms",
              "loss_by_silence_ms", "silence_bound_ms");
  for (int n : sizes) bench("127.0.0.1", port, n);
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  return 0;
}
