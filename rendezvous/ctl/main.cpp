// musterctl: asks a rendezvous (musterd, or an agent hosting one) what it is
// doing. `musterctl jobs` lists every job; `musterctl job ID` shows one job's
// members and its last failure. Both with --json.
#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "ctl_cli.hpp"
#include "muster/common/endpoint.hpp"
#include "muster/common/log.hpp"
#include "muster/common/version.hpp"
#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/client.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "muster/common/text.hpp"

namespace {

using muster::Status;
using namespace muster::rendezvous;
using muster::log_excerpt;
using nlohmann::json;

// 850ms, 12s, 3m05s, 2h10m, 3d04h.
std::string human(long long ms) {
  char buf[32];
  long long s = ms / 1000;
  if (ms < 1000) std::snprintf(buf, sizeof buf, "%lldms", ms);
  else if (s < 60) std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else if (s < 86400) std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  else std::snprintf(buf, sizeof buf, "%lldd%02lldh", s / 86400, (s % 86400) / 3600);
  return buf;
}

// What a peer sent, safe for a terminal: control bytes escaped.
std::string safe(const std::string& text) { return log_excerpt(text, 4096); }

// Left-aligned columns, as wide as their widest cell (every cell made safe).
void print_table(std::vector<std::vector<std::string>> rows) {
  for (auto& r : rows) {
    for (auto& cell : r) cell = safe(cell);
  }
  std::vector<std::size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

std::string summary_line(const JobSummary& j) {
  return "job '" + safe(j.id) + "': " + safe(j.state) + ", round " + std::to_string(j.round) + ", restarts " +
         std::to_string(j.restarts) + "/" + std::to_string(j.max_restarts) + ", " + std::to_string(j.nodes) +
         " node(s) joined (" + std::to_string(j.in_round) + " in the round) of " + std::to_string(j.min_nodes) +
         ":" + std::to_string(j.max_nodes) + ", age " + human(j.age_ms);
}

void print_jobs(const std::vector<JobSummary>& jobs) {
  std::vector<std::vector<std::string>> rows{{"JOB", "STATE", "NODES", "MIN", "MAX", "ROUND", "RESTARTS", "AGE"}};
  for (const auto& j : jobs) {
    rows.push_back({j.id, j.state, std::to_string(j.nodes), std::to_string(j.min_nodes), std::to_string(j.max_nodes),
                    std::to_string(j.round), std::to_string(j.restarts) + "/" + std::to_string(j.max_restarts),
                    human(j.age_ms)});
  }
  print_table(rows);
}

void print_job(const JobReply& r) {
  if (r.job.state == kNotJoinedState) {
    std::cout << "job '" << safe(r.job.id) << "': no node has joined it; " << r.unhealthy.size()
              << " node(s) stay out, failing their health check\n";
  } else {
    std::cout << summary_line(r.job) << "\n";
  }
  if (!r.members.empty()) {
    std::vector<std::vector<std::string>> rows{
        {"GROUP_RANK", "NODE", "ADDRESS", "WORKERS", "ROLE", "STATE", "LAST_HEARD"}};
    for (const auto& m : r.members) {
      std::string state = m.parked_ms ? "excluded, " + human(*m.parked_ms) + " left"
                          : m.in_round ? "in round"
                          : m.waiting  ? "waiting"
                                       : "joined";
      if (!m.connected) state += ", disconnected";
      rows.push_back({m.group_rank ? std::to_string(*m.group_rank) : "-", m.node, m.address,
                      std::to_string(m.local_world_size), m.role, state, human(m.heard_ms_ago) + " ago"});
    }
    print_table(rows);
  }
  if (r.job.state == kNotJoinedState) {
    // Nothing else to say of a job nobody joined.
  } else if (r.last_failure) {
    const auto& f = *r.last_failure;
    std::string message = f.message.substr(0, f.message.find('\n'));
    std::cout << "last failure: rank " << f.global_rank << " (local rank " << f.local_rank << ", pid " << f.pid
              << ") on node " << safe(r.last_failure_node) << " (" << safe(f.host) << "), exit code " << f.exitcode << ", "
              << human(r.last_failure_ms_ago) << " ago" << (message.empty() ? "" : ": " + log_excerpt(message, 300))
              << "\n";
  } else {
    std::cout << "no failure reported\n";
  }
  for (const auto& e : r.exclusions) {
    std::cout << "excluded: node " << safe(e.node) << " (" << safe(e.address) << "), " << e.count
              << (e.count == 1 ? " time" : " times") << ", "
              << (e.left_ms > 0 ? "for another " + human(e.left_ms) : std::string("cooldown over")) << ": "
              << safe(log_excerpt(e.why, 300)) << "\n";
  }
  for (const auto& u : r.unhealthy) {
    std::cout << "health check failing: node " << safe(u.node) << " (" << safe(u.address) << "), " << u.failures
              << (u.failures == 1 ? " time" : " times") << ", last " << human(u.reported_ms_ago) << " ago";
    long long next = u.retry_in_ms - u.reported_ms_ago;
    if (u.retry_in_ms > 0) std::cout << (next > 0 ? ", tries again in " + human(next) : std::string(", trying again"));
    std::cout << ": " << safe(log_excerpt(u.detail, 300)) << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  muster::ctl::Options opt;
  CLI::App app;
  muster::ctl::define(app, opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2, as getopt tools do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Only what goes wrong is said, on stderr.
  muster::log::set_level(muster::log::Level::error);
  muster::log::init_from_env("musterctl");
  auto ep = muster::parse_endpoint(opt.endpoint, 29400);
  if (!ep.ok()) {
    std::cerr << "musterctl: error: --endpoint: " << ep.status().message() << "\n";
    return 2;
  }
  auto key = auth::find_key(opt.key_file, std::getenv("MUSTER_AUTH_KEY_FILE"), std::getenv("CREDENTIALS_DIRECTORY"));
  if (!key.ok()) {
    std::cerr << "musterctl: error: " << key.status().message() << "\n";
    return 2;
  }

  boost::asio::io_context io(1);
  int rc = 1;
  bool done = false;
  std::string error;
  std::vector<JobSummary> jobs;
  JobReply job;
  StacksReply stacks;
  std::shared_ptr<RendezvousClient> client;
  auto finish = [&](int code, std::string why) {
    if (done) return;
    done = true;
    rc = code;
    error = std::move(why);
    client->close();
    io.stop();
  };
  std::string host = ep->host.size() > 2 && ep->host.front() == '[' ? ep->host.substr(1, ep->host.size() - 2) : ep->host;
  client = std::make_shared<RendezvousClient>(
      io, host, ep->port,
      [&](const json& m) {
        const std::string& type = m["type"].get_ref<const std::string&>();
        if (type == "error") {
          return finish(1, "the rendezvous at " + client->address() + " said: " + log_excerpt(error_text(m), 2000));
        }
        if (opt.command == "jobs" && type == "jobs") {
          auto r = jobs_reply_from_json(m);
          if (!r.ok()) return finish(1, "a bad reply from " + client->address() + ": " + r.status().message());
          for (auto& j : r->jobs) jobs.push_back(std::move(j));
          if (r->next_after) return client->send(to_json(JobsQuery{*r->next_after}));
          return finish(0, "");
        }
        if (opt.command == "job" && type == "job") {
          auto r = job_reply_from_json(m);
          if (!r.ok()) return finish(1, "a bad reply from " + client->address() + ": " + r.status().message());
          // Later pages carry members only: the first page's lists stay.
          auto members = std::move(job.members);
          auto exclusions = std::move(job.exclusions);
          auto unhealthy = std::move(job.unhealthy);
          const bool first = job.job.id.empty();
          job = std::move(r.value());
          members.insert(members.end(), job.members.begin(), job.members.end());
          job.members = std::move(members);
          if (!first) {
            job.exclusions = std::move(exclusions);
            job.unhealthy = std::move(unhealthy);
          }
          if (job.next_from) return client->send(to_json(JobQuery{opt.job, *job.next_from}));
          job.next_from.reset();
          return finish(0, "");
        }
        if (opt.command == "stacks" && type == "stacks") {
          auto r = stacks_reply_from_json(m);
          if (!r.ok()) return finish(1, "a bad reply from " + client->address() + ": " + r.status().message());
          stacks = r.value();
          return finish(0, "");
        }
        finish(1, "the rendezvous at " + client->address() + " answered '" + log_excerpt(type, 64) +
                      "'; is it an older release without operator queries?");
      },
      [&](const Status& st) { finish(1, st.message()); },
      [&](const Status& st) { finish(1, st.message()); });
  if (key.value()) client->set_auth_key(key.value()->key);
  auto timeout = std::chrono::milliseconds(static_cast<long long>(opt.timeout * 1000));
  client->connect(timeout, [&] {
    if (opt.command == "jobs") client->send(to_json(JobsQuery{}));
    else if (opt.command == "stacks") client->send(to_json(StacksQuery{opt.job}));
    else client->send(to_json(JobQuery{opt.job, 0}));
  });
  io.run_for(timeout + std::chrono::seconds(1));
  if (!done) {
    client->close();
    std::cerr << "musterctl: error: no answer from the rendezvous at " << client->address() << " within "
              << opt.timeout << " s\n";
    return 1;
  }
  if (rc != 0) {
    std::cerr << "musterctl: error: " << error << "\n";
    return rc;
  }
  if (opt.command == "stacks") {
    if (opt.json) {
      json out = to_json(stacks);
      out.erase("type");
      out.erase("v");
      std::cout << out.dump(2) << "\n";
      return stacks.asked > 0 ? 0 : 1;
    }
    if (stacks.asked == 0 && stacks.unable == 0) {
      std::cout << "job '" << safe(opt.job) << "' is " << safe(stacks.state)
                << ": no workers run, so there are no stacks to take\n";
      return 1;
    }
    std::cout << "asked " << stacks.asked << " agent(s) of job '" << safe(opt.job)
              << "' to write their workers' Python stacks to their logs";
    if (stacks.unable > 0) std::cout << "; " << stacks.unable << " agent(s) run an older muster and cannot";
    std::cout << "\n";
    return stacks.asked > 0 ? 0 : 1;
  }
  if (opt.command == "jobs") {
    if (opt.json) {
      json out = {{"jobs", json::array()}};
      for (const auto& j : jobs) out["jobs"].push_back(to_json(j));
      std::cout << out.dump(2) << "\n";
    } else {
      print_jobs(jobs);
    }
  } else if (opt.json) {
    json out = to_json(job);
    out.erase("type");
    out.erase("v");
    std::cout << out.dump(2) << "\n";
  } else {
    print_job(job);
  }
  return 0;
}
