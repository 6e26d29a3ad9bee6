// bench/rendezvous: N simulated agents in this one process, each its own TCP
// connection on loopback, join one musterd (started here, fresh for each size).
// Measures
//   1. formation: first connect -> the last agent holding its assignment;
//   2. loss by leave: one agent says `leave` and closes (as an agent that
//      exits does) -> the last survivor holding its restart order (a
//      connection that just breaks keeps its place for the dead-after window,
//      so it can resume: that loss is the silence one below);
//   3. loss by silence: one agent stops heartbeating -> the last survivor
//      holding its restart order, against keep_alive_interval x attempts;
//   4. musterd's memory: peak RSS, and RSS gained per agent once formed;
//   5. the messages and bytes musterd sent the agents while forming, to show
//      they are O(N).
// Then many small jobs at once: J jobs of K agents, formation of them all.
//
//   rendezvous_bench MUSTERD [N...]      (default N: 100 1000 10000 19000; 100000 where the descriptor limit allows)
//   rendezvous_bench MUSTERD --jobs J K  (only the many-jobs run)
//
// What it sets, so that 100,000 connections fit on one machine:
//   - RLIMIT_NOFILE raised (soft and, as root, hard) to what the largest size
//     needs, inherited by musterd;
//   - each agent binds a source address of its run's block of 127.0.0.0/8
//     (loopback_source.hpp), so the ephemeral ports never run out and no run
//     reuses an address whose ports are still in TIME_WAIT;
//   - at most kInFlight connects at once (the listen backlog).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loopback_source.hpp"
#include "muster/rendezvous/protocol.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using muster::rendezvous::FrameReader;
using muster::rendezvous::encode_frame;

namespace {

constexpr int kAttempts = 2;
// At most kInFlight connects at once: more would overflow the listen backlog
// (net.core.somaxconn, 4096 here) and the kernel would retry dropped SYNs
// after a full second, measuring the kernel's timer instead of musterd.
constexpr int kInFlight = 1024;

// Heartbeats from every agent every interval/2 are load of their own: 100,000
// agents at 1 s would send 200,000 a second. The interval grows with the size,
// as a real deployment of that size would set it (torch's default is 5 s).
int keep_alive_ms(int n) { return n > 20000 ? 5000 : 1000; }

struct Musterd {
  pid_t pid = -1;
  int port = 0;

  static Musterd start(const std::string& path) {
    Musterd d;
    int fds[2];
    if (pipe(fds) != 0) return d;
    d.pid = fork();
    if (d.pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      // musterd logs every join at INFO; thousands of lines to the console
      // would be measured with it.
      setenv("LOGLEVEL", "WARNING", 1);
      // Each source address carries 20,000 agents: lift the per-address cap.
      execl(path.c_str(), path.c_str(), "--listen", "127.0.0.1:0", "--max-connections-per-peer", "1000000",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    char line[256] = {0};
    FILE* out = fdopen(fds[0], "r");
    if (out && fgets(line, sizeof line, out)) {
      std::string l(line);
      d.port = std::stoi(l.substr(l.rfind(':') + 1));
    }
    if (out) fclose(out);
    return d;
  }
  // VmRSS or VmHWM in KiB.
  long status_kib(const char* field) const {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string key;
    long value = -1;
    while (in >> key) {
      if (key == std::string(field) + ":") {
        in >> value;
        break;
      }
      in.ignore(1 << 12, '\n');
    }
    return value;
  }
  void stop() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// How many agents hold each message type as their latest: the runs wait on
// these counts instead of scanning every agent.
using Tally = std::map<std::string, int>;

struct Agent : std::enable_shared_from_this<Agent> {
  Agent(asio::io_context& io, Tally& tally, int id, std::string job, int n)
      : socket(io), tally(tally), id(id), job(std::move(job)), n(n) {}
  tcp::socket socket;
  Tally& tally;
  int id;
  std::string job;
  int n;  // the job's size
  FrameReader reader;
  std::array<char, 4096> buf{};
  std::string type_seen;  // set through saw()
  Clock::time_point when{};
  long messages = 0;
  long bytes_in = 0;
  bool silent = false;

  void saw(const std::string& type) {
    if (!type_seen.empty()) --tally[type_seen];
    type_seen = type;
    if (!type_seen.empty()) ++tally[type_seen];
  }
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
    socket.async_read_some(asio::buffer(buf), [self](boost::system::error_code ec, std::size_t got) {
      if (ec) return;
      self->bytes_in += static_cast<long>(got);
      self->reader.feed(std::string_view(self->buf.data(), got));
      while (true) {
        auto f = self->reader.next();
        if (!f.ok() || !f.value()) break;
        auto m = json::parse(*f.value());
        self->saw(m["type"].get<std::string>());
        self->when = Clock::now();
        ++self->messages;
      }
      self->read();
    });
  }
  json join_message() const {
    return {{"type", "join"},
            {"v", 1},
            {"job", job},
            {"node", "node" + std::to_string(id)},
            {"address", "10." + std::to_string(id / 62500) + "." + std::to_string(id / 250 % 250) + "." +
                            std::to_string(id % 250)},
            {"local_world_size", 8},
            {"store_port", 29500},
            {"settings",
             {{"min_nodes", std::max(1, n - 2)},
              {"max_nodes", n},
              {"keep_alive_interval_ms", keep_alive_ms(n)},
              {"keep_alive_max_attempt", kAttempts},
              {"join_timeout_ms", 300000},
              {"last_call_timeout_ms", 1000}}}};
  }
};

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

using Agents = std::vector<std::shared_ptr<Agent>>;

// Whether every agent from index `from` on holds `type` as its latest message.
bool all_saw(const Agents& agents, std::size_t from, const char* type) {
  if (agents.empty()) return true;
  auto it = agents.front()->tally.find(type);
  std::size_t have = it == agents.front()->tally.end() ? 0 : static_cast<std::size_t>(it->second);
  for (std::size_t i = 0; i < from && i < agents.size(); ++i)
    if (agents[i]->type_seen == type) --have;
  return have >= agents.size() - from;
}

Clock::time_point last_message(const Agents& agents, std::size_t from) {
  Clock::time_point l{};
  for (std::size_t i = from; i < agents.size(); ++i) l = std::max(l, agents[i]->when);
  return l;
}

void report_stuck(const Agents& agents, const char* what) {
  std::map<std::string, int> seen;
  for (auto& a : agents) seen[a->type_seen.empty() ? "(nothing)" : a->type_seen]++;
  std::printf("  %s did not complete:", what);
  for (auto& [t, c] : seen) std::printf(" %s=%d", t.c_str(), c);
  std::printf("\n");
}

// One fresh musterd and the agents that join it.
struct Formation {
  Musterd d;
  asio::io_context io{1};
  Tally tally;
  Agents agents;
  long rss_before = 0;
  // Filled by form():
  double formation_ms = -1;
  long messages = 0, bytes = 0;
  long rss_formed = 0;

  bool start(const std::string& musterd_path) {
    d = Musterd::start(musterd_path);
    if (d.port == 0) std::printf("musterd did not start\n");
    rss_before = d.status_kib("VmRSS");
    return d.port != 0;
  }
  void add(int id, const std::string& job, int n) { agents.push_back(std::make_shared<Agent>(io, tally, id, job, n)); }
  // Connects every agent (kInFlight at a time) from its source address in
  // `block`, each sending its join, and waits until all hold an assignment.
  bool form(int block, std::chrono::seconds limit, const std::string& what) {
    auto t0 = Clock::now();
    tcp::endpoint to(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(d.port));
    for (std::size_t i = 0; i < std::min(agents.size(), static_cast<std::size_t>(kInFlight)); ++i)
      connect_next(to, block);
    if (!run_until(io, [&] { return failed_ > 0 || all_saw(agents, 0, "assign"); }, limit) || failed_ > 0) {
      report_stuck(agents, what.c_str());
      return false;
    }
    formation_ms = ms_between(t0, last_message(agents, 0));
    for (auto& a : agents) messages += a->messages, bytes += a->bytes_in;
    rss_formed = d.status_kib("VmRSS");
    return true;
  }
  ~Formation() {
    agents.clear();
    io.run_for(std::chrono::milliseconds(50));
    d.stop();
  }

 private:
  void connect_next(const tcp::endpoint& to, int block) {
    if (next_ >= agents.size()) return;
    std::size_t i = next_++;
    auto a = agents[i];
    boost::system::error_code ec;
    bench::bind_loopback_source(a->socket, static_cast<unsigned>(block), static_cast<unsigned>(i), ec);
    if (ec) {
      std::fprintf(stderr, "socket/bind failed: %s\n", ec.message().c_str());
      ++failed_;
      return;
    }
    a->socket.async_connect(to, [this, a, to, block](boost::system::error_code ec) {
      if (ec) {
        std::fprintf(stderr, "connect failed: %s\n", ec.message().c_str());
        ++failed_;
        return;
      }
      a->socket.set_option(tcp::no_delay(true));
      a->read();
      a->send(a->join_message());
      connect_next(to, block);
    });
  }
  std::size_t next_ = 0;
  int failed_ = 0;
};

void one_job(const std::string& musterd_path, int n, int block) {
  Formation f;
  if (!f.start(musterd_path)) return;
  f.agents.reserve(static_cast<std::size_t>(n));
  const std::string job = "bench" + std::to_string(n);
  for (int i = 0; i < n; ++i) f.add(i, job, n);
  if (!f.form(block, std::chrono::seconds(120 + n / 500), "N=" + std::to_string(n) + " formation")) return;
  auto& io = f.io;
  auto& agents = f.agents;

  const int keep_alive = keep_alive_ms(n);
  // Heartbeats from everyone but the silent ones.
  // How late this one-thread load generator's heartbeat round ran at worst:
  // past keep_alive / 2 + the dead-after window's slack, a drop is its fault.
  asio::steady_timer beat(io);
  double beat_late_ms = 0;
  std::function<void()> heartbeat = [&] {
    auto due = beat.expiry();
    if (due != Clock::time_point{}) beat_late_ms = std::max(beat_late_ms, ms_between(due, Clock::now()));
    for (auto& a : agents)
      if (!a->silent && a->socket.is_open()) a->send({{"type", "heartbeat"}, {"v", 1}});
    beat.expires_after(std::chrono::milliseconds(keep_alive / 2));
    beat.async_wait([&](boost::system::error_code ec) {
      if (!ec) heartbeat();
    });
  };
  heartbeat();

  // 2. Loss by leave: agent 0 goes away.
  auto t_drop = Clock::now();
  agents[0]->leave();
  double leave_ms = -1;
  if (run_until(io, [&] { return all_saw(agents, 1, "restart"); }, std::chrono::seconds(60)))
    leave_ms = ms_between(t_drop, last_message(agents, 1));
  else
    report_stuck(agents, "loss by leave");
  // The survivors re-form (min is N-2), after the last call.
  for (std::size_t i = 1; i < agents.size(); ++i) {
    agents[i]->saw("");
    agents[i]->send(agents[i]->join_message());
  }
  double silence_ms = -1;
  if (run_until(io, [&] { return all_saw(agents, 1, "assign"); }, std::chrono::seconds(60))) {
    // 3. Loss by silence: agent 1 stops heartbeating (its connection stays open).
    agents[1]->silent = true;
    auto t_silent = Clock::now();
    if (run_until(io, [&] { return all_saw(agents, 2, "restart"); }, std::chrono::seconds(60 + 4 * keep_alive / 1000)))
      silence_ms = ms_between(t_silent, last_message(agents, 2));
    else
      report_stuck(agents, "loss by silence");
  } else {
    report_stuck(agents, "re-formation");
  }
  beat.cancel();
  long peak = f.d.status_kib("VmHWM");
  std::printf("%-8d %13.1f %10ld %12ld %16.1f %18.1f %16d %13.1f %15.2f\n", n, f.formation_ms, f.messages, f.bytes,
              leave_ms, silence_ms, keep_alive * kAttempts, peak / 1024.0,
              static_cast<double>(f.rss_formed - f.rss_before) / n);
  // Which side lags under load: this generator's own heartbeat round (musterd
  // says in its log when its timers run late, "this server is behind").
  std::printf("         load generator: its heartbeat round ran at most %.0f ms late (interval %d ms)\n", beat_late_ms,
              keep_alive / 2);
  std::fflush(stdout);
}

// J jobs of K agents each at once: the time until every agent of every job
// holds its assignment.
void many_jobs(const std::string& musterd_path, int jobs, int k, int block) {
  Formation f;
  if (!f.start(musterd_path)) return;
  for (int j = 0; j < jobs; ++j)
    for (int i = 0; i < k; ++i) f.add(j * k + i, "job" + std::to_string(j), k);
  if (!f.form(block, std::chrono::seconds(120), "many jobs formation")) return;
  double gained = static_cast<double>(f.rss_formed - f.rss_before);
  std::printf("%d jobs x %d agents: all formed in %.1f ms; %ld messages, %ld bytes to agents; musterd RSS +%.1f MiB "
              "(%.2f KiB per agent)\n",
              jobs, k, f.formation_ms, f.messages, f.bytes, gained / 1024.0,
              gained / static_cast<double>(f.agents.size()));
}

// Raises the descriptor limit to `want` (musterd inherits it). Returns the
// soft limit in force.
rlim_t raise_nofile(rlim_t want) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_max < want) {
    rlimit more{want, want};
    if (setrlimit(RLIMIT_NOFILE, &more) == 0) return want;  // root (CAP_SYS_RESOURCE)
  }
  lim.rlim_cur = std::min(want, lim.rlim_max);
  setrlimit(RLIMIT_NOFILE, &lim);
  getrlimit(RLIMIT_NOFILE, &lim);
  return lim.rlim_cur;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: rendezvous_bench MUSTERD [N...] | MUSTERD --jobs J K\n");
    return 2;
  }
  std::string musterd = argv[1];
  std::vector<int> sizes;
  int jobs = 1000, per_job = 4;
  bool only_jobs = argc >= 3 && std::string(argv[2]) == "--jobs";
  if (only_jobs) {
    if (argc != 5) return 2;
    jobs = std::atoi(argv[3]);
    per_job = std::atoi(argv[4]);
  } else {
    for (int i = 2; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
    if (sizes.empty()) sizes = {100, 1000, 10000, 19000};
  }
  int largest = jobs * per_job;
  for (int n : sizes) largest = std::max(largest, n);
  // One descriptor per agent here and one in musterd, plus slack.
  auto want = static_cast<rlim_t>(largest) + 256;
  rlim_t got = raise_nofile(want);
  std::printf("RLIMIT_NOFILE %llu (needs %llu); source addresses 127.B.x.y, %u agents each; %d connects in flight\n",
              static_cast<unsigned long long>(got), static_cast<unsigned long long>(want), bench::kPerSourceAddress,
              kInFlight);
  if (got < want) {
    std::printf("the descriptor limit is too low for %d agents: run as root, or raise the hard limit (ulimit -Hn)\n",
                largest);
    return 1;
  }
  int block = 1;
  if (!only_jobs) {
    std::printf("keep_alive_interval 1 s (5 s above 20,000 agents) x %d attempts; musterd fresh for each size\n",
                kAttempts);
    std::printf("%-8s %13s %10s %12s %16s %18s %16s %13s %15s\n", "agents", "formation_ms", "messages", "bytes",
                "loss_by_leave_ms", "loss_by_silence_ms", "silence_bound_ms", "peak_rss_MiB", "KiB_per_agent");
    for (int n : sizes) one_job(musterd, n, block++);
  }
  many_jobs(musterd, jobs, per_job, block++);
  return 0;
}
