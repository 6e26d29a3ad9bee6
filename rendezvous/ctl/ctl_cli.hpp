// musterctl's command line: one definition for --help, the man page
// (tools/man_pages) and main().
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "muster/common/version.hpp"

namespace muster::ctl {

struct Options {
  std::string endpoint = "127.0.0.1:29400";
  std::string key_file;
  bool json = false;
  double timeout = 10;
  std::string command;  // "jobs", "job" or "stacks"
  std::string job;
};

inline void define(CLI::App& app, Options& o) {
  app.name("musterctl");
  app.description(
      "Asks a muster rendezvous (musterd, or the agent that hosts a job's rendezvous) what it is doing: its "
      "jobs, their members and their failures.");
  app.set_version_flag("--version", std::string("musterctl ") + version_string());
  app.add_option("--endpoint", o.endpoint, "HOST:PORT of musterd or of the agent hosting the rendezvous")
      ->capture_default_str()
      ->envname("MUSTER_ENDPOINT");
  app.add_option("--auth-key-file", o.key_file,
                 "the rendezvous's shared key (default: $MUSTER_AUTH_KEY_FILE, then systemd's credential "
                 "muster-auth-key)");
  app.add_flag("--json", o.json, "print JSON instead of a table");
  app.add_option("--timeout", o.timeout, "seconds to wait for the rendezvous")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.fallthrough();
  app.require_subcommand(1);
  auto* jobs = app.add_subcommand(
      "jobs", "one line per job, open or recently finished: id, state, nodes joined, min and max nodes, round, "
              "restarts used and allowed, age");
  jobs->callback([&o] { o.command = "jobs"; });
  auto* job = app.add_subcommand(
      "job", "one job: its members (group rank, node identity, address, local world size, role, state, last "
             "heartbeat), its last failure, its excluded nodes, and the nodes that stay out of it because their "
             "health check fails (with how it failed and when it runs again)");
  job->add_option("ID", o.job, "the job's --rdzv-id")->required();
  job->callback([&o] { o.command = "job"; });
  auto* stacks = app.add_subcommand(
      "stacks", "asks every agent of a running job to take its workers' Python stacks (py-spy dump) and write them "
                "to its log (and to --log-dir's attempt folder, stacks.txt per worker); says how many agents were "
                "asked");
  stacks->add_option("ID", o.job, "the job's --rdzv-id")->required();
  stacks->callback([&o] { o.command = "stacks"; });
}

}  // namespace muster::ctl
