// The failure reporter: what this node's agent says when its job fails, and the
// error file it hands to its parent.
//
// Contract. It keeps the current attempt's record of each worker: its error
// file, how it exited, whether the agent killed it as hung (start_attempt
// clears it). From that record and the core's failures it builds torchrun's
// ChildFailedError report: this node's failures with the first one as the root
// cause; for a multi-node job whose first failure was on another node, that
// rank (from the rendezvous) as the root cause and this node's stopped workers
// after it; with one report per job (a Slurm step), node rank 0 alone prints
// it and the others say where to look. The root cause's error file, when it is
// this node's, goes to the parent's TORCHELASTIC_ERROR_FILE by rename. It
// writes only through `say` and the log, and never throws.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent_core.hpp"
#include "failure_report.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "supervisor.hpp"

namespace muster::launcher {

class FailureReporter {
 public:
  struct Settings {
    std::string entrypoint_name;                  // what the report says failed
    std::string host;                             // this machine's FQDN, for the report
    std::optional<std::string> parent_error_file;  // the agent's own TORCHELASTIC_ERROR_FILE
    std::chrono::milliseconds worker_timeout{0};  // --worker-timeout, for a hung worker's message
    bool one_report_per_job = false;              // a Slurm step: node rank 0 reports
  };
  using Say = std::function<void(const std::string&)>;
  // The pid of a worker that has not exited (0 when none is known).
  using PidOf = std::function<pid_t(int local_rank)>;

  FailureReporter(Settings settings, Say say);

  // The attempt's record.
  void start_attempt(int base_global_rank);
  void set_error_file(int local_rank, std::string path);
  void exited(const WorkerExit& e);
  void hung(int local_rank, std::chrono::milliseconds silent_for);
  bool is_hung(int local_rank) const { return hung_.count(local_rank) > 0; }
  const WorkerExit* exit_of(int local_rank) const;
  std::string error_file(int local_rank) const;

  // This node's failures as torchrun reports them; the root cause's error file
  // goes to the parent.
  void report_local(const std::vector<ObservedFailure>& failures, const PidOf& pid_of);
  // A multi-node job's end with `root` (the job's first failure, on any node)
  // as its root cause. node_address: this node's, as the rendezvous knows it.
  void report_job(const rendezvous::FailureInfo& root, const std::vector<ObservedFailure>& failures,
                  const std::string& node_address, int group_rank, bool started_workers, const PidOf& pid_of);
  // The failure of local_rank as this node tells the rendezvous.
  rendezvous::FailureInfo rendezvous_failure(int local_rank, const std::string& node_address) const;

 private:
  ProcessFailure failure_of(const ObservedFailure& f, const PidOf& pid_of) const;
  void note_hung(int local_rank, std::string& message) const;
  void copy_error_file_to_parent(const ProcessFailure& root) const;

  Settings settings_;
  Say say_;
  int base_global_rank_ = 0;
  std::map<int, std::string> error_files_;
  std::map<int, WorkerExit> exits_;
  std::map<int, std::chrono::milliseconds> hung_;
};

}  // namespace muster::launcher
