#include "torchrun_options.hpp"

namespace muster::launcher {
namespace {

using argparse::Kind;
using argparse::OptionSpec;
using argparse::Type;

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = {
      {{"-h", "--help"}, Kind::help, Type::str, false, std::nullopt, {}, "show this help message and exit"},
      {{"--version"}, Kind::version, Type::str, false, std::nullopt, {}, "show muster's version and exit"},
      {{"--nnodes"}, Kind::value, Type::str, true, "1:1", {},
       "Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>."},
      {{"--nproc-per-node", "--nproc_per_node"}, Kind::value, Type::str, true, "1", {},
       "Number of workers per node; supported values: [auto, cpu, gpu, int]."},
      {{"--rdzv-backend", "--rdzv_backend"}, Kind::value, Type::str, true, "static", {},
       "Rendezvous backend: static or c10d; slurm forms one job over the Slurm step (docs/slurm.md)."},
      {{"--rdzv-endpoint", "--rdzv_endpoint"}, Kind::value, Type::str, true, "", {},
       "Rendezvous backend endpoint; usually in form <host>:<port>."},
      {{"--rdzv-id", "--rdzv_id"}, Kind::value, Type::str, true, "none", {}, "User-defined group id."},
      {{"--rdzv-conf", "--rdzv_conf"}, Kind::value, Type::str, true, "", {},
       "Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...)."},
      {{"--standalone"}, Kind::flag, Type::str, true, std::nullopt, {},
       "Run a rendezvous of one node inside the agent on a free port; --rdzv-backend, "
       "--rdzv-endpoint and --rdzv-id are assigned and explicit values ignored."},
      {{"--max-restarts", "--max_restarts"}, Kind::value, Type::integer, true, "0", {},
       "Maximum number of worker group restarts before failing."},
      {{"--monitor-interval", "--monitor_interval"}, Kind::value, Type::real, true, "0.1", {},
       "Accepted for compatibility; muster sees worker exits as they happen and never polls."},
      {{"--start-method", "--start_method"}, Kind::value, Type::str, true, "spawn",
       {"spawn", "fork", "forkserver"},
       "Accepted for compatibility; only function entrypoints used it."},
      {{"--event-log-handler", "--event_log_handler"}, Kind::value, Type::str, true, "null", {},
       "Event log handler: null, console (the events torch's agent records) or dynamic_rendezvous."},
      {{"--role"}, Kind::value, Type::str, true, "default", {}, "User-defined role for the workers."},
      {{"-m", "--module"}, Kind::flag, Type::str, true, std::nullopt, {},
       "Run the training script as a Python module (python -m)."},
      {{"--no-python", "--no_python"}, Kind::flag, Type::str, true, std::nullopt, {},
       "Execute the training script directly instead of through python."},
      {{"--run-path", "--run_path"}, Kind::flag, Type::str, true, std::nullopt, {},
       "Run the script in the worker's Python through runpy.run_path, as torchrun's run_script_path does."},
      {{"--log-dir", "--log_dir"}, Kind::value, Type::str, true, std::nullopt, {},
       "Base directory for log files (the same directory is reused across runs)."},
      {{"-r", "--redirects"}, Kind::value, Type::str, true, "0", {},
       "Redirect std streams into a log file in the log directory (0-3, or e.g. 0:1,1:2)."},
      {{"-t", "--tee"}, Kind::value, Type::str, true, "0", {},
       "Tee std streams into a log file and also to the console (0-3, or a per-rank map)."},
      {{"--local-ranks-filter", "--local_ranks_filter"}, Kind::value, Type::str, true, "", {},
       "Only show logs from the given local ranks on the console (e.g. 0,1,2)."},
      {{"--duplicate-stdout-filters", "--duplicate_stdout_filters"}, Kind::value, Type::str, true, "", {},
       "Comma list of strings; tee'd stdout lines containing one are copied to "
       "<attempt_dir>/filtered_stdout.log (',,' is a literal comma)."},
      {{"--duplicate-stderr-filters", "--duplicate_stderr_filters"}, Kind::value, Type::str, true, "", {},
       "As --duplicate-stdout-filters, for stderr (filtered_stderr.log)."},
      {{"--node-rank", "--node_rank"}, Kind::value, Type::integer, true, "0", {},
       "Rank of the node for multi-node distributed training (static rendezvous)."},
      {{"--master-addr", "--master_addr"}, Kind::value, Type::str, true, "127.0.0.1", {},
       "Address of the master node (rank 0), used by the static rendezvous only."},
      {{"--master-port", "--master_port"}, Kind::value, Type::integer, true, std::nullopt, {},
       "Port on the master node (rank 0), used by the static rendezvous only. Defaults to 29500."},
      {{"--local-addr", "--local_addr"}, Kind::value, Type::str, true, std::nullopt, {},
       "Address this node advertises; defaults to the machine's FQDN."},
      {{"--logs-specs", "--logs_specs"}, Kind::value, Type::str, false, std::nullopt, {},
       "Not supported: Python LogsSpecs plugins."},
      {{"--numa-binding", "--numa_binding"}, Kind::value, Type::str, false, std::nullopt,
       {"node", "socket", "exclusive", "core-complex"},
       "Bind each worker to the CPUs near the GPU of its local rank, by torch's rules (node: the GPU's NUMA "
       "node; socket: its socket's nodes; exclusive: a share of the node's physical cores; core-complex: one "
       "last-level cache's CPUs); applied with sched_setaffinity, no numactl needed (docs/numa.md)."},
      {{"--signals-to-handle", "--signals_to_handle"}, Kind::value, Type::str, true,
       "SIGTERM,SIGINT,SIGHUP,SIGQUIT", {},
       "Comma list of signals the agent forwards to the workers."},
      {{"--shutdown-timeout", "--shutdown_timeout"}, Kind::value, Type::integer, true, std::nullopt, {},
       "Seconds between the stop signal and SIGKILL (default: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30)."},
      {{"--virtual-local-rank", "--virtual_local_rank"}, Kind::flag, Type::str, true, std::nullopt, {},
       "LOCAL_RANK=0 for every worker, each worker seeing its own CUDA_VISIBLE_DEVICES entry."},
      {{"--auth-key-file", "--auth_key_file"}, Kind::value, Type::str, false, std::nullopt, {},
       "A file holding the rendezvous's shared secret (default: $MUSTER_AUTH_KEY_FILE, then systemd's "
       "credential muster-auth-key); every agent of the job and its rendezvous need the same one.", false},
      {{"--metrics-listen", "--metrics_listen"}, Kind::value, Type::str, false, std::nullopt, {},
       "ADDR[:PORT] to serve the agent's Prometheus metrics on (GET /metrics; port 9401 by default; "
       "default: $MUSTER_METRICS_LISTEN, else none).", false},
      {{"--worker-timeout", "--worker_timeout"}, Kind::value, Type::str, false, std::nullopt, {},
       "Seconds a worker may go without progress (a byte on stdout or stderr, a request on the store this "
       "agent hosts, a file-timer request) before it is taken for hung and the group fails as on a crash "
       "(default: $MUSTER_WORKER_TIMEOUT, else 0: never).", false},
      {{"--health-check", "--health_check"}, Kind::value, Type::str, false, std::nullopt, {},
       "A command (run by /bin/sh -c) that must succeed before this node joins the rendezvous, the first time "
       "and at every rejoin; a node whose check fails stays out of the job and tries again after a growing "
       "cooldown (default: $MUSTER_HEALTH_CHECK, else none; docs/failures.md).", false},
      {{"--health-check-timeout", "--health_check_timeout"}, Kind::value, Type::str, false, std::nullopt, {},
       "Seconds a health check may take before it is killed and counts as failed (default: "
       "$MUSTER_HEALTH_CHECK_TIMEOUT, else 60).", false},
      {{"--health-check-interval", "--health_check_interval"}, Kind::value, Type::str, false, std::nullopt, {},
       "Seconds between health checks while this node's workers run (0: only before joins); a node whose check "
       "fails leaves the job, which re-forms without it, uncounted, and joins again once its check passes "
       "(default: $MUSTER_HEALTH_CHECK_INTERVAL, else 0; needs --health-check).", false},
      {{"--exclude-exit-code", "--exclude_exit_code"}, Kind::value, Type::str, false, std::nullopt, {},
       "A worker that exits with this code (1-255) asks for its node to be excluded from the job: the job "
       "re-forms without the node where it can, and the node may join again as a spare after a cooldown "
       "(default: $MUSTER_EXCLUDE_EXIT_CODE, else none; docs/failures.md).", false},
      {{"--hostfile"}, Kind::value, Type::str, false, std::nullopt, {},
       "Launch the job on every host of this file over ssh, one host a line as `host slots=N` (DeepSpeed's "
       "and Open MPI's format; slots is that host's --nproc-per-node), # comments; --nnodes defaults to the "
       "number of hosts (docs/launching.md).", false},
      {{"--hosts"}, Kind::value, Type::str, false, std::nullopt, {},
       "The hosts as a list, h1[:slots],h2[:slots],[ipv6]:slots, instead of --hostfile.", false},
      {{"--include"}, Kind::value, Type::str, false, std::nullopt, {},
       "With --hostfile or --hosts: run only on these hosts, and slots, as DeepSpeed writes it: "
       "host1@host2:0,2 (host2's slots 0 and 2).", false},
      {{"--exclude"}, Kind::value, Type::str, false, std::nullopt, {},
       "With --hostfile or --hosts: run on every host but these (or without these slots): host1@host2:1.",
       false},
      {{"--export"}, Kind::value, Type::str, false, std::nullopt, {},
       "With --hostfile or --hosts: NAME or NAME=VALUE, an environment variable the remote agents and their "
       "workers get, the launching shell's value when none is given; may be repeated (docs/launching.md "
       "lists what is carried by default).", false, true},
      {{"--from-launcher"}, Kind::value, Type::str, false, std::nullopt, {},
       "Set by a launching muster --hostfile on the agents it starts over ssh: VERSION is its own, which this "
       "muster must match; the agent then reads its orders from its standard input.", false},
  };
  return table;
}

}  // namespace

Result<ParsedArgs> parse_args(const std::vector<std::string>& argv, const Environment& env) {
  return argparse::parse(option_table(), argv, env);
}

std::vector<OptionDoc> option_docs() {
  std::vector<OptionDoc> out;
  for (const auto& spec : option_table()) {
    OptionDoc d;
    d.names = spec.names;
    if (spec.kind == Kind::value) d.metavar = spec.metavar();
    d.choices = spec.choices;
    d.default_value = spec.default_value;
    d.pet = spec.pet;
    d.dest = spec.dest();
    d.help = spec.help;
    out.push_back(std::move(d));
  }
  return out;
}

std::string usage_text(const std::string& prog) { return argparse::usage(option_table(), prog); }

std::string help_text(const std::string& prog) {
  // torchrun's options, then muster's own.
  argparse::Table torchrun;
  argparse::Table own;
  std::string own_names;
  for (const auto& spec : option_table()) {
    bool mine = !spec.torchrun;
    (mine ? own : torchrun).push_back(spec);
    if (mine) own_names += (own_names.empty() ? "" : ", ") + spec.names.front();
  }
  std::string out = usage_text(prog);
  out +=
      "\nmuster: the torchrun-compatible launcher for distributed training. Every torchrun option also\n"
      "reads its default from PET_<NAME> (e.g. PET_NPROC_PER_NODE); muster's own (" + own_names + ")\n"
      "read no PET_ variable; those whose help names a MUSTER_* variable read it.\n\n"
      "positional arguments:\n"
      "  training_script       the program or script to run in every worker, followed by its arguments\n"
      "  training_script_args\n\noptions:\n";
  out += argparse::options_help(torchrun);
  out += "\nmuster's own options (not torchrun's):\n";
  return out + argparse::options_help(own);
}

}  // namespace muster::launcher
