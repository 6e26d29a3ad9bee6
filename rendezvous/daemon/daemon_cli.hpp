// musterd's command line: one definition for --help, the man page
// (tools/man_pages) and main().
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <string>

#include "muster/common/version.hpp"
#include "muster/rendezvous/server.hpp"

namespace muster::daemon {

struct Options {
  std::string listen;  // "": loopback only
  std::string key_file;
  std::string metrics_listen;
  rendezvous::ServerLimits limits;
  long long join_wait_ms = rendezvous::ServerLimits{}.join_wait.count();
  long long lifetime_s =
      std::chrono::duration_cast<std::chrono::seconds>(rendezvous::ServerLimits{}.finished_job_lifetime).count();

  // The durations, from their command-line units.
  void apply() {
    limits.join_wait = std::chrono::milliseconds(join_wait_ms);
    limits.finished_job_lifetime = std::chrono::seconds(lifetime_s);
  }
};

inline void define(CLI::App& app, Options& o) {
  app.name("musterd");
  app.description(
      "The muster rendezvous daemon: forms jobs of muster agents (--rdzv-backend=c10d "
      "--rdzv-endpoint=HOST:PORT), assigns their ranks, notices dead nodes and orders restarts; any number of "
      "jobs, keyed by --rdzv-id.");
  app.set_version_flag("--version", std::string("musterd ") + version_string());
  app.add_option("--listen", o.listen,
                 "ADDR:PORT to listen on (0.0.0.0:29400 for every IPv4 interface, [::]:29400 for every "
                 "interface); without it, loopback only (127.0.0.1:29400)");
  app.add_option("--auth-key-file", o.key_file,
                 "a file holding the shared secret every agent must prove it holds (default: "
                 "$MUSTER_AUTH_KEY_FILE, then systemd's credential muster-auth-key)");
  app.add_option("--metrics-listen", o.metrics_listen,
                 "ADDR:PORT to serve Prometheus metrics on (GET /metrics); none without it");
  app.add_option("--max-jobs", o.limits.max_jobs, "jobs open at once; a join that would open one more is rejected")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{10000000}));
  app.add_option("--max-connections-per-peer", o.limits.max_connections_per_peer,
                 "connections held from one IP address; more are closed at once")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{10000000}));
  app.add_option("--join-wait-ms", o.join_wait_ms, "a connection that has not joined within this is closed")
      ->capture_default_str()
      ->check(CLI::Range(1LL, 86400000LL));
  app.add_option("--finished-job-lifetime", o.lifetime_s,
                 "seconds a finished job is remembered, so late joiners learn it is closed")
      ->capture_default_str()
      ->check(CLI::Range(0LL, 30LL * 86400));
  app.add_option("--max-finished-jobs", o.limits.max_tombstones, "finished jobs remembered at most (oldest go first)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, std::size_t{100000000}));
}

}  // namespace muster::daemon
