#include "failure_reporter.hpp"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "muster/common/log.hpp"
#include "muster/common/duration.hpp"

namespace muster::launcher {

namespace {

long long unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

long long now_unix() { return static_cast<long long>(std::time(nullptr)); }

}  // namespace

FailureReporter::FailureReporter(Settings settings, Say say) : settings_(std::move(settings)), say_(std::move(say)) {}

void FailureReporter::start_attempt(int base_global_rank) {
  base_global_rank_ = base_global_rank;
  error_files_.clear();
  exits_.clear();
  hung_.clear();
}

void FailureReporter::set_error_file(int local_rank, std::string path) { error_files_[local_rank] = std::move(path); }

void FailureReporter::exited(const WorkerExit& e) { exits_[e.local_rank] = e; }

void FailureReporter::hung(int local_rank, std::chrono::milliseconds silent_for) { hung_[local_rank] = silent_for; }

const WorkerExit* FailureReporter::exit_of(int local_rank) const {
  auto it = exits_.find(local_rank);
  return it == exits_.end() ? nullptr : &it->second;
}

std::string FailureReporter::error_file(int local_rank) const {
  auto it = error_files_.find(local_rank);
  return it == error_files_.end() ? std::string() : it->second;
}

void FailureReporter::note_hung(int local_rank, std::string& message) const {
  auto it = hung_.find(local_rank);
  if (it == hung_.end()) return;
  message = "hung: no progress for " + seconds_text(it->second) + " (--worker-timeout " +
            seconds_text(settings_.worker_timeout) + "), killed by muster; " + message;
}

ProcessFailure FailureReporter::failure_of(const ObservedFailure& f, const PidOf& pid_of) const {
  const WorkerExit* e = exit_of(f.local_rank);
  pid_t pid = e ? e->pid : pid_of(f.local_rank);
  long long when = e ? unix_seconds(e->when) : now_unix();
  auto p = make_process_failure(base_global_rank_ + f.local_rank, f.local_rank, pid, f.status.torch_exitcode(),
                                error_file(f.local_rank), when, f.stopped_by_agent);
  note_hung(f.local_rank, p.message);
  return p;
}

void FailureReporter::report_local(const std::vector<ObservedFailure>& observed, const PidOf& pid_of) {
  if (observed.empty()) return;
  std::vector<ProcessFailure> failures;
  for (const auto& f : observed) failures.push_back(failure_of(f, pid_of));
  say_("ChildFailedError: " + format_failure_report(settings_.entrypoint_name, failures, settings_.host) + "\n");
  copy_error_file_to_parent(failures[root_cause_index(failures)]);
}

void FailureReporter::report_job(const rendezvous::FailureInfo& root, const std::vector<ObservedFailure>& observed,
                                 const std::string& node_address, int group_rank, bool started_workers,
                                 const PidOf& pid_of) {
  const bool root_is_here = root.host == node_address && !observed.empty();
  const ObservedFailure* own_failure = nullptr;  // the first worker here that failed by itself
  for (const auto& f : observed) {
    if (!f.stopped_by_agent) {
      own_failure = &f;
      break;
    }
  }
  auto exited_pid = [this](int local_rank) {
    const WorkerExit* e = exit_of(local_rank);
    return e ? e->pid : 0;
  };
  if (settings_.one_report_per_job && (group_rank != 0 || !started_workers)) {
    // One stream for the whole job (a Slurm step): node rank 0 prints the report
    // (an agent that never started workers holds no node rank).
    say_("muster: rank " + std::to_string(root.global_rank) + " on " + root.host + " failed (exitcode " +
         std::to_string(root.exitcode) + "); node rank 0's agent prints the job's failure report\n");
    if (root_is_here && own_failure) {
      int lr = own_failure->local_rank;
      copy_error_file_to_parent(make_process_failure(base_global_rank_ + lr, lr, exited_pid(lr),
                                                     own_failure->status.torch_exitcode(), error_file(lr), now_unix(),
                                                     false));
    }
    return;
  }
  if (root_is_here && own_failure) return report_local(observed, pid_of);

  // The root cause is elsewhere: it first, then this node's workers stopped because of it.
  std::vector<ProcessFailure> failures;
  ProcessFailure r;
  r.global_rank = root.global_rank;
  r.local_rank = root.local_rank;
  r.exitcode = root.exitcode;
  r.pid = root.pid;
  r.error_file = "<N/A> (on " + root.host + ")";
  r.message = root.message;
  r.timestamp = root.timestamp;
  r.host = root.host;
  failures.push_back(r);
  for (const auto& f : observed) {
    auto p = make_process_failure(base_global_rank_ + f.local_rank, f.local_rank, exited_pid(f.local_rank),
                                  f.status.torch_exitcode(), "", now_unix(), true);
    p.host = node_address;
    p.message = "stopped by muster after rank " + std::to_string(root.global_rank) + " on " + root.host +
                " failed: " + p.message;
    failures.push_back(p);
  }
  say_("ChildFailedError: " + format_failure_report(settings_.entrypoint_name, failures, settings_.host) + "\n");
}

rendezvous::FailureInfo FailureReporter::rendezvous_failure(int local_rank, const std::string& node_address) const {
  rendezvous::FailureInfo f;
  f.global_rank = base_global_rank_ + local_rank;
  f.local_rank = local_rank;
  f.host = node_address;
  const WorkerExit* e = exit_of(local_rank);
  pid_t pid = e ? e->pid : 0;
  f.pid = static_cast<int>(pid);
  f.exitcode = e ? e->status.torch_exitcode() : is_hung(local_rank) ? -SIGKILL : 1;
  auto pf = make_process_failure(f.global_rank, local_rank, pid, f.exitcode, error_file(local_rank), now_unix(), false);
  note_hung(local_rank, pf.message);
  // The protocol's limit on text; an error file can hold more.
  f.message = pf.message.size() > rendezvous::kMaxTextLength
                  ? pf.message.substr(0, rendezvous::kMaxTextLength - 32) + " ... (truncated)"
                  : pf.message;
  f.timestamp = std::max<long long>(0, pf.timestamp);
  return f;
}

void FailureReporter::copy_error_file_to_parent(const ProcessFailure& root) const {
  const auto& parent = settings_.parent_error_file;
  if (!parent || parent->empty() || root.error_file == "<N/A>") return;
  auto content = read_error_file(root.error_file);
  if (!content.ok()) return;
  try {
    auto data = nlohmann::json::parse(content->raw_json);
    if (data["message"].is_object() && root.exitcode != 0) data["message"]["errorCode"] = root.exitcode;
    // Whole or not at all: a parent reading it never sees half of it.
    std::string tmp = *parent + ".tmp." + std::to_string(getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << data.dump();
      out.close();
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), parent->c_str()) != 0) {
      std::string why = std::strerror(errno);
      std::remove(tmp.c_str());
      throw std::runtime_error("cannot rename " + tmp + ": " + why);
    }
    log::info("dumped error file to parent's " + *parent);
  } catch (const std::exception& e) {
    log::warning("cannot copy the error file " + root.error_file + " to " + *parent + ": " + e.what());
  }
}

}  // namespace muster::launcher
