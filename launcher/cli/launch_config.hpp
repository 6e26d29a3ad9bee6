// What a muster command line means once parsed and resolved: torchrun's
// LaunchConfig plus the worker command.
#pragma once

#include <map>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "numa_binding.hpp"
#include "rdzv_conf.hpp"
#include "std_spec.hpp"

namespace muster::launcher {

struct LaunchConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;  // after the static / standalone rewrites
  std::string rdzv_id = "none";
  std::map<std::string, std::string> rdzv_conf;  // "timeout" always present, as in torchrun
  RendezvousOptions rdzv;                         // the keys muster reads, resolved
  bool standalone = false;
  // The job runs through a rendezvous (a multi-node job, or a c10d one whose
  // endpoint the user gave, even for one node, as torchrun contacts it);
  // false: one node forms its group alone (--standalone, a plain one-node
  // launch, the static backend of one node, a one-node Slurm step).
  bool coordinated = false;
  int max_restarts = 0;
  double monitor_interval = 0.1;
  std::string event_log_handler = "null";  // null, console, dynamic_rendezvous
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  // --run-path: the script run by runpy.run_path in the worker's Python, as
  // torchrun's function entrypoint run_script_path.
  bool run_path = false;
  std::string start_method = "spawn";  // only named in --run-path's failure log
  std::optional<std::string> log_dir;
  StdSpec redirects;
  StdSpec tee;
  std::optional<std::set<int>> local_ranks_filter;
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::optional<std::string> local_addr;
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::vector<int> signal_numbers;  // the parsed form of signals_to_handle
  int shutdown_timeout = 30;
  bool virtual_local_rank = false;
  // --numa-binding: bind each worker to the CPUs near its GPU (numa_binding.hpp).
  std::optional<numa::Mode> numa_binding;
  // The CPUs of each local rank's worker under --numa-binding, computed once
  // before any worker starts (empty: no binding).
  std::vector<numa::CpuSet> worker_cpus;
  // muster's own: the rendezvous's shared secret ("": from the environment).
  std::string auth_key_file;
  // torchrun's file-based watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1): the
  // named pipe the workers write timers to ("": no watchdog).
  std::string file_timer_path;
  // muster's own: where to serve the agent's metrics ("": nowhere).
  std::string metrics_listen;
  // muster's own: a worker without progress for this long is hung (0: never;
  // progress_watch.hpp says what counts).
  std::chrono::milliseconds worker_timeout{0};
  // muster's own: the node's health check, run before every join ("": none),
  // and how long one run may take.
  std::string health_check;
  std::chrono::milliseconds health_check_timeout{60000};
  // muster's own: how often the check runs while the workers run (0: never;
  // only before joins).
  std::chrono::milliseconds health_check_interval{0};
  // --exclude-exit-code: a worker exiting with it asks for its node's exclusion.
  std::optional<int> exclude_exit_code;

  // The worker program: executable (PATH lookup when it has no '/') and its
  // arguments, before $local_rank substitution.
  std::string executable;
  std::vector<std::string> args;
  // The name shown in the failure report's title.
  std::string entrypoint_name;
  // executable is python3, to be found on PATH: logs name the full path found.
  bool python_from_path = false;

  // Set when OMP_NUM_THREADS was absent and nproc > 1: the agent sets it to 1
  // and prints torchrun's banner.
  bool set_omp_num_threads = false;

  // The nodes' output meets in one stream: a Slurm step of several nodes,
  // whose srun gathers every task's output. Then only node rank 0 prints the
  // job-wide failure report, and the other nodes one line naming the cause.
  bool one_report_per_job = false;

  // Set on an agent a launching command (muster --hostfile) started over ssh:
  // its host's place in the host list, carried in its joins, and the
  // rendezvous's key that command made for the job (hex; never in the
  // workers' environment).
  std::optional<int> launch_order;
  std::optional<std::string> launch_key_hex;

  // Things to log at WARNING once logging is up.
  std::vector<std::string> warnings;
  // Lines to print as "muster: ..." on stderr (what was inferred from Slurm).
  std::vector<std::string> notices;
};

}  // namespace muster::launcher
