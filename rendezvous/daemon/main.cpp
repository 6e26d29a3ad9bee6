// musterd: the rendezvous daemon. Hosts any number of jobs keyed by rdzv_id;
// agents reach it with --rdzv-backend=c10d --rdzv-endpoint=<host>:<port>.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <ctime>
#include <functional>
#include <optional>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "daemon_cli.hpp"
#include "muster/common/endpoint.hpp"
#include "muster/common/log.hpp"
#include "muster/common/version.hpp"
#include "muster/metrics/http.hpp"
#include "muster/net/unique_fd.hpp"
#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/server.hpp"

namespace {

// systemd's readiness protocol (Type=notify), without linking libsystemd.
void notify_systemd(const char* state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  muster::net::UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::size_t len = std::strlen(path);
  if (len >= sizeof addr.sun_path) return;
  std::memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  ::sendto(fd.get(), state, std::strlen(state), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr),
           static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len));
}

constexpr std::chrono::microseconds kStatusEvery = std::chrono::seconds(5);

// systemd's WATCHDOG_USEC, when it is meant for this process.
std::optional<std::chrono::microseconds> watchdog_interval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr || usec[0] == '\0') return std::nullopt;
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr && pid[0] != '\0') {
    if (std::strtoll(pid, nullptr, 10) != static_cast<long long>(getpid())) return std::nullopt;
  }
  char* end = nullptr;
  long long v = std::strtoll(usec, &end, 10);
  if (end == usec || *end != '\0' || v <= 0) return std::nullopt;
  return std::chrono::microseconds(v);
}

// RELOADING=1 with the monotonic time that systemd 253 and later ask for.
std::string reloading_message() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long long usec = static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  return "RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec);
}

std::string render_metrics(muster::rendezvous::ServerStats st) {
  muster::metrics::Text t;
  t.family("musterd_jobs", "gauge", "Jobs the daemon holds: open ones by state, finished ones it remembers by outcome.");
  for (const auto& [state, n] : st.jobs) t.sample({{"state", state}}, static_cast<double>(n));
  t.family("musterd_nodes", "gauge", "Nodes (agents) that are members of an open job.");
  t.sample(static_cast<double>(st.nodes));
  t.family("musterd_connections", "gauge", "Open connections.");
  t.sample(static_cast<double>(st.connections));
  t.family("musterd_rounds_total", "counter", "Rounds completed (ranks assigned), over every job.");
  t.sample(static_cast<double>(st.totals.rounds));
  t.family("musterd_restarts_total", "counter", "Rounds ended by a worker failure with a restart left.");
  t.sample(static_cast<double>(st.totals.restarts));
  t.family("musterd_failures_total", "counter", "Worker failures reported by agents.");
  t.sample(static_cast<double>(st.totals.failures));
  t.family("musterd_node_losses_total", "counter",
           "Members lost: silence (no heartbeat within the dead-after window), closed (the agent's side closed its "
           "connection without leave and did not come back within 5 s) or left (the agent said goodbye).");
  t.sample({{"reason", "silence"}}, static_cast<double>(st.totals.lost_to_silence));
  t.sample({{"reason", "closed"}}, static_cast<double>(st.totals.lost_to_close));
  t.sample({{"reason", "left"}}, static_cast<double>(st.totals.left));
  t.family("musterd_failures_held_total", "counter",
           "Worker failures held because another member of the round could not be reached at the time.");
  t.sample(static_cast<double>(st.totals.failures_held));
  t.family("musterd_nodes_excluded_total", "counter",
           "Nodes excluded from their job: the root cause of exclude_after failed attempts in a row, or asked for "
           "by a worker's --exclude-exit-code.");
  t.sample(static_cast<double>(st.totals.excluded));
  t.family("musterd_behind_total", "counter",
           "Times a job's timer ran 0.1 s or more late: the event loop could not read the members' heartbeats "
           "meanwhile (short of CPU, or a storm of joins), and that silence was not counted against them.");
  t.sample(static_cast<double>(st.behind));
  t.family("musterd_behind_seconds_total", "counter", "How late those timers ran, in all.");
  t.sample(st.behind_seconds);
  t.family("musterd_health_reports_total", "counter",
           "Reports of a failing health check from agents that stay out of their job until it passes.");
  t.sample(static_cast<double>(st.health_reports));
  t.family("musterd_unhealthy_nodes", "gauge",
           "Nodes whose latest report is a failing health check, and which have not joined since.");
  t.sample(static_cast<double>(st.unhealthy));
  t.family("musterd_rejected_total", "counter", "Connections and joins refused, by reason.");
  for (const auto& [reason, n] : st.rejected) t.sample({{"reason", reason}}, static_cast<double>(n));
  t.family("musterd_build_info", "gauge", "The running musterd's version.");
  t.sample({{"version", muster::version_number()}, {"revision", muster::git_revision()}}, 1);
  return t.str();
}

}  // namespace

int main(int argc, char** argv) {
  muster::daemon::Options opt;
  CLI::App app;
  muster::daemon::define(app, opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2, as getopt tools do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  opt.apply();
  const auto& limits = opt.limits;
  std::string listen = opt.listen;
  const std::string& key_file = opt.key_file;

  // A daemon says what it does (jobs, rounds, losses) unless LOGLEVEL says otherwise.
  muster::log::set_level(muster::log::Level::info);
  muster::log::init_from_env("musterd");
  // One descriptor per agent or store client: take the whole hard limit.
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  bool loopback_default = listen.empty();
  if (loopback_default) listen = "127.0.0.1:29400";
  auto ep = muster::parse_endpoint(listen, 29400);
  if (!ep.ok()) {
    std::cerr << "musterd: error: --listen: " << ep.status().message() << "\n";
    return 2;
  }
  auto key = muster::rendezvous::auth::find_key(key_file, std::getenv("MUSTER_AUTH_KEY_FILE"),
                                                std::getenv("CREDENTIALS_DIRECTORY"));
  if (!key.ok()) {
    std::cerr << "musterd: error: " << key.status().message() << "\n";
    return 2;
  }
  boost::asio::io_context io(1);
  auto server = muster::rendezvous::RendezvousServer::listen(io, ep->host == "localhost" ? "127.0.0.1" : ep->host,
                                                             ep->port, limits);
  if (!server.ok()) {
    std::cerr << "musterd: error: " << server.status().message() << "\n";
    return 1;
  }
  if (key.value()) server.value()->require_auth(key.value()->key);
  // The port line comes first on stdout, so scripts can use --listen ADDR:0.
  std::cout << "musterd listening on " << ep->host << ":" << server.value()->port() << std::endl;
  if (loopback_default) {
    muster::log::warning("musterd: listening on loopback only (127.0.0.1:29400): agents on other hosts cannot "
                         "reach it; give --listen ADDR:PORT (0.0.0.0:29400 for every interface)");
  }
  bool loopback = ep->host == "localhost" || ep->host.rfind("127.", 0) == 0 || ep->host == "::1" ||
                  ep->host == "[::1]";
  if (key.value()) {
    muster::log::info("musterd: agents must prove they hold the key from " + key.value()->source);
  } else if (!loopback) {
    muster::log::warning("musterd: no auth key: any process that reaches " + ep->host + ":" +
                         std::to_string(server.value()->port()) +
                         " can join a job, take its rank 0 or end it; give --auth-key-file (docs/security.md)");
  }
  auto& rdzv = *server.value();

  std::unique_ptr<muster::metrics::HttpServer> metrics;
  if (!opt.metrics_listen.empty()) {
    auto m = muster::metrics::HttpServer::listen_at(io, "--metrics-listen", opt.metrics_listen, 9400,
                                                    [&rdzv] { return render_metrics(rdzv.stats()); });
    if (!m.ok()) {
      std::cerr << "musterd: error: " << m.status().message() << "\n";
      return m.status().code() == muster::Code::invalid_argument ? 2 : 1;
    }
    metrics = std::move(m.value());
    std::cout << "musterd metrics on " << metrics->endpoint() << std::endl;
  }

  // systemd: the watchdog is fed from this loop (a wedged loop stops feeding
  // it and is restarted), and STATUS= says what the daemon holds.
  auto watchdog = watchdog_interval();
  auto tick = watchdog ? std::min<std::chrono::microseconds>(*watchdog / 2, kStatusEvery) : kStatusEvery;
  boost::asio::steady_timer status_timer(io);
  std::string last_status;
  std::function<void()> feed = [&] {
    if (watchdog) notify_systemd("WATCHDOG=1");
    auto st = rdzv.stats();
    std::size_t open_jobs = st.jobs["forming"] + st.jobs["running"] + st.jobs["closed"];
    std::string status = "STATUS=" + std::to_string(open_jobs) + " jobs, " + std::to_string(st.nodes) + " nodes, " +
                         std::to_string(st.connections) + " connections";
    if (status != last_status) {
      notify_systemd(status.c_str());
      last_status = status;
    }
    status_timer.expires_after(tick);
    status_timer.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) feed();
    });
  };

  // SIGHUP reloads the key (the same source as at start): new connections
  // need the new one, authenticated ones keep theirs.
  boost::asio::signal_set hangup(io, SIGHUP);
  std::function<void()> on_hangup = [&] {
    hangup.async_wait([&](const boost::system::error_code& ec, int) {
      if (ec) return;
      notify_systemd(reloading_message().c_str());
      auto fresh = muster::rendezvous::auth::find_key(key_file, std::getenv("MUSTER_AUTH_KEY_FILE"),
                                                      std::getenv("CREDENTIALS_DIRECTORY"));
      if (!fresh.ok()) {
        muster::log::error("musterd: reload: " + fresh.status().message() + "; keeping the key in use");
      } else if (!fresh.value()) {
        muster::log::error(rdzv.requires_auth() ? "musterd: reload: no key is configured any more; keeping the "
                                                  "key in use (restart musterd to run without one)"
                                                : "musterd: reload: no key configured; nothing to reload");
      } else if (!rdzv.requires_auth()) {
        muster::log::error("musterd: reload: a key is configured now, but musterd started without one; restart "
                           "musterd to require it (its running jobs' agents have no key)");
      } else {
        rdzv.rotate_key(fresh.value()->key);
        muster::log::info("musterd: reloaded the auth key from " + fresh.value()->source +
                          "; new connections may prove it or the key it replaces, until the next reload");
      }
      notify_systemd("READY=1");
      on_hangup();
    });
  };
  on_hangup();

  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](const boost::system::error_code&, int signo) {
    notify_systemd("STOPPING=1");
    muster::log::warning("musterd: signal " + std::to_string(signo) + ", shutting down");
    status_timer.cancel();
    hangup.cancel();
    if (metrics) metrics->close();
    rdzv.close();
    io.stop();
  });
  notify_systemd("READY=1");
  if (std::getenv("NOTIFY_SOCKET") != nullptr) feed();
  io.run();
  return 0;
}
