#include "config_from_args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <csignal>
#include <limits>
#include <sstream>

#include "muster/common/endpoint.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "progress_watch.hpp"
#include "rdzv_conf.hpp"
#include "signals.hpp"
#include "slurm.hpp"

namespace muster::launcher {
namespace {

using argparse::parse_python_float;
using argparse::parse_python_int;
using argparse::trim;

std::string get(const ParsedArgs& a, const std::string& dest) {
  auto it = a.values.find(dest);
  return it == a.values.end() ? std::string() : it->second;
}
bool has(const ParsedArgs& a, const std::string& dest) { return a.values.count(dest) > 0; }
bool flag(const ParsedArgs& a, const std::string& dest) {
  auto it = a.flags.find(dest);
  return it != a.flags.end() && it->second;
}
std::optional<std::string> env_get(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// "a,,b,c" → {"a,b", "c"}: ',,' is a literal comma.
std::vector<std::string> split_filters(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::string cur;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',') {
      if (i + 1 < text.size() && text[i + 1] == ',') {
        cur.push_back(',');
        ++i;
        continue;
      }
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      continue;
    }
    cur.push_back(text[i]);
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// Inside a Slurm step, with none of the options that say how nodes meet given
// (nor their PET_ forms), or with --rdzv-backend=slurm: the step's nodes form
// one job on the static rendezvous at its first host (docs/slurm.md). The
// inferred values go into args as if given; notices says what was inferred.
Status apply_slurm(ParsedArgs& args, const Environment& env, std::vector<std::string>& notices) {
  auto user_set = [&](const std::string& dest) {
    return args.given.count(dest) > 0 || env.count(argparse::pet_variable(dest)) > 0;
  };
  bool asked = get(args, "rdzv_backend") == "slurm";
  std::vector<std::string> meeting = {"nnodes", "node_rank", "rdzv_endpoint", "master_addr", "standalone"};
  std::string set_by_user;
  for (const auto& dest : meeting) {
    if (user_set(dest) && set_by_user.empty()) set_by_user = dest;
  }
  if (!asked && (user_set("rdzv_backend") || !set_by_user.empty())) return {};  // torchrun's behaviour, as given
  auto step = read_slurm_step(env);
  if (!step.ok()) return step.status();
  if (!step.value()) {
    if (!asked) return {};
    return invalid_argument("--rdzv-backend=slurm: this is not a Slurm step (SLURM_JOB_ID and "
                            "SLURM_STEP_NUM_NODES are unset); run muster with srun, or pick another backend");
  }
  if (asked && !set_by_user.empty()) {
    std::string option = "--" + set_by_user;
    std::replace(option.begin(), option.end(), '_', '-');
    return invalid_argument("--rdzv-backend=slurm takes the job's shape from the Slurm step; drop " + option);
  }
  const SlurmStep& s = **step;
  args.values["nnodes"] = std::to_string(s.nodes);
  args.values["rdzv_backend"] = "static";
  args.values["node_rank"] = std::to_string(s.node_id);
  args.values["master_addr"] = s.head;
  // One node: the port is chosen as for any one-node job (torchrun's behaviour).
  if (!user_set("master_port") && s.nodes > 1) args.values["master_port"] = std::to_string(s.port);
  if (!user_set("rdzv_id")) args.values["rdzv_id"] = "slurm-" + s.job_id + "." + s.step_id;
  std::string nproc_from = "--nproc-per-node";
  if (!user_set("nproc_per_node")) {
    if (s.gpus_on_node && *s.gpus_on_node > 0) {
      args.values["nproc_per_node"] = std::to_string(*s.gpus_on_node);
      nproc_from = "SLURM_GPUS_ON_NODE";
    } else {
      nproc_from = "the default";
    }
  }
  notices.push_back("Slurm step " + s.job_id + "." + s.step_id + ": one job over its " + std::to_string(s.nodes) +
                    " node(s), this one node rank " + std::to_string(s.node_id) + ", rendezvous and store at " +
                    s.head + ":" + (has(args, "master_port") ? get(args, "master_port") : std::string("a free port")) +
                    ", " + get(args, "nproc_per_node") +
                    " worker(s) per node (" + nproc_from + ")");
  return {};
}

// --run-path: what torchrun's run_script_path does, as `python -u -c` code.
// torchrun's worker then waits, its script done, until the agent has the
// results of every worker of the node, so none exits while a peer still runs
// (torch's process-group teardown at exit can abort when peers leave at
// different times). Here the agent gives each attempt a folder
// (MUSTER_RUN_PATH_DONE_DIR) where each worker that is done leaves a file
// named after its RANK, and waits until the node's MUSTER_RUN_PATH_WORKERS
// are there; a peer that fails instead ends the group, and with it the wait.
constexpr const char* kRunScriptPath =
    "import os, runpy, sys, time; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "d = os.environ.get('MUSTER_RUN_PATH_DONE_DIR')\n"
    "if d:\n"
    "    open(os.path.join(d, os.environ['RANK']), 'w').close()\n"
    "    while len(os.listdir(d)) < int(os.environ['MUSTER_RUN_PATH_WORKERS']): time.sleep(0.05)\n";

// Options that only make sense inside a Python launcher, and the event handler's name.
Status refuse_python_plugins(const ParsedArgs& args, LaunchConfig& cfg) {
  // torchrun's default LogsSpecs is registered as "default": the layout muster
  // writes. Any other name is a Python plugin class.
  if (has(args, "logs_specs") && get(args, "logs_specs") != "default") {
    return invalid_argument("Could not find entrypoint under 'torchrun.logs_specs[" + get(args, "logs_specs") +
                            "]' key: muster has torchrun's 'default' only (a LogsSpecs plugin is a Python class, "
                            "which a native launcher cannot load); use --log-dir, -r/--redirects, -t/--tee and "
                            "--local-ranks-filter instead");
  }
  if (has(args, "numa_binding")) {
    // argparse checked the choices.
    cfg.numa_binding = numa::parse_mode(get(args, "numa_binding"));
  }
  // torch's registered handlers (torch/distributed/elastic/events/handlers.py).
  cfg.event_log_handler = get(args, "event_log_handler");
  if (cfg.event_log_handler != "null" && cfg.event_log_handler != "console" &&
      cfg.event_log_handler != "dynamic_rendezvous") {
    return invalid_argument("--event-log-handler='" + cfg.event_log_handler +
                            "' is not a registered event handler: use null, console or dynamic_rendezvous");
  }
  return {};
}

// --nnodes: N or MIN:MAX.
Status parse_nnodes(const std::string& text, LaunchConfig& cfg) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ':')) parts.push_back(part);
  if (!text.empty() && text.back() == ':') parts.push_back("");
  auto bad = invalid_argument("nnodes=" + text + " is not in \"MIN:MAX\" format");
  if (parts.empty() || parts.size() > 2) return bad;
  auto lo = parse_python_int(parts[0]);
  auto hi = parts.size() == 2 ? parse_python_int(parts[1]) : lo;
  if (!lo || !hi) return invalid_argument("nnodes=" + text + ": '" + (lo ? parts[1] : parts[0]) +
                                          "' is not an integer; use N or MIN:MAX");
  if (!(*lo > 0 && *lo <= *hi)) {
    return invalid_argument("min_nodes must be > 0 and <= max_nodes, got min_nodes=" +
                            std::to_string(*lo) + ", max_nodes=" + std::to_string(*hi));
  }
  if (*hi > rendezvous::kMaxNodes) {
    return invalid_argument("nnodes=" + text + ": a job has at most " + std::to_string(rendezvous::kMaxNodes) +
                            " nodes");
  }
  cfg.min_nodes = static_cast<int>(*lo);
  cfg.max_nodes = static_cast<int>(*hi);
  return {};
}

// The rendezvous: backend, endpoint and run id, with torchrun's rewrite of a
// one-node launch to a private c10d rendezvous (which needs max_nodes).
// A fresh id (torch's uuid4) for a private rendezvous or the file timer's pipe.
Result<std::string> fresh_run_id(const HostFacts& host) {
  if (!host.new_run_id) return std::string("standalone");
  return host.new_run_id();
}

Status choose_rendezvous(const ParsedArgs& args, const HostFacts& host, LaunchConfig& cfg) {
  std::string backend = get(args, "rdzv_backend");
  std::string endpoint = get(args, "rdzv_endpoint");
  std::string run_id = get(args, "rdzv_id");
  cfg.standalone = flag(args, "standalone");
  bool private_rendezvous = cfg.standalone;
  if (cfg.standalone) {
    backend = "c10d";
    endpoint = "localhost:0";
    auto id = fresh_run_id(host);
    if (!id.ok()) return id.status();
    run_id = std::move(id.value());
  } else if (backend == "static" && endpoint.empty() && !has(args, "master_port") && cfg.max_nodes == 1) {
    // A plain single-node launch gets a private rendezvous on a free port, as torchrun does.
    private_rendezvous = true;
    backend = "c10d";
    endpoint = "localhost:0";
    auto id = fresh_run_id(host);
    if (!id.ok()) return id.status();
    run_id = std::move(id.value());
  }
  cfg.master_port = has(args, "master_port") ? static_cast<int>(*parse_python_int(get(args, "master_port"))) : 29500;
  cfg.master_addr = get(args, "master_addr");

  if (backend != "static" && backend != "c10d") {
    if (backend == "etcd" || backend == "etcd-v2") {
      return invalid_argument("the rendezvous backend '" + backend +
                              "' needs an etcd server, which muster does not use; use "
                              "--rdzv-backend=c10d (hosted by an agent or by musterd)");
    }
    return invalid_argument("The rendezvous backend '" + backend +
                            "' is not registered: muster supports static and c10d");
  }
  cfg.rdzv_backend = backend;
  cfg.rdzv_id = run_id;
  if (backend != "static" && endpoint.empty()) {
    cfg.warnings.push_back("master_addr is only used for static rdzv_backend and when rdzv_endpoint is not specified.");
  }
  if (backend != "static" && *parse_python_int(get(args, "node_rank")) != 0) {
    cfg.warnings.push_back("node_rank is only used for static rdzv_backend. It will be ignored for rdzv_backend=" +
                           backend + ".");
  }

  cfg.rdzv_endpoint = endpoint;  // the static backend's default comes with the node rank
  // One node of c10d at an endpoint the user named contacts it, as torchrun
  // does: the job shows in musterd, and a port held by something else is said.
  cfg.coordinated = cfg.max_nodes > 1 || (backend == "c10d" && !private_rendezvous && !endpoint.empty());
  return {};
}

// --rdzv-conf and --node-rank; the static backend's endpoint defaults to
// --master-addr:--master-port.
Status parse_rendezvous_conf(const ParsedArgs& args, LaunchConfig& cfg) {
  auto conf = parse_rdzv_conf(get(args, "rdzv_conf"));
  if (!conf.ok()) return conf.status();
  cfg.rdzv_conf = conf.value();
  long long rank = *parse_python_int(get(args, "node_rank"));
  bool fits = rank >= 0 && rank < rendezvous::kMaxNodes;
  if (!fits && cfg.rdzv_backend == "static") {
    return invalid_argument("--node-rank=" + std::to_string(rank) + " is not in [0, " +
                            std::to_string(rendezvous::kMaxNodes) + ")");
  }
  cfg.node_rank = fits ? static_cast<int>(rank) : 0;  // other backends ignore it
  if (cfg.rdzv_backend == "static") {
    // The static backend's rules, here only: the agent trusts them.
    if (cfg.node_rank >= cfg.max_nodes) {
      return invalid_argument(
          cfg.max_nodes == 1
              ? "--node-rank=" + std::to_string(cfg.node_rank) +
                    " does not exist in a job of one node; use --node-rank=0 or --nnodes=N"
              : "--node-rank=" + std::to_string(cfg.node_rank) + " is outside [0, " + std::to_string(cfg.max_nodes) +
                    ") for --nnodes=" + std::to_string(cfg.max_nodes));
    }
    cfg.rdzv_conf["rank"] = std::to_string(cfg.node_rank);
    if (cfg.rdzv_endpoint.empty()) cfg.rdzv_endpoint = cfg.master_addr + ":" + std::to_string(cfg.master_port);
    auto ep = parse_endpoint(cfg.rdzv_endpoint, -1);
    if (!ep.ok()) return ep.status();
    if (ep->port < 0) {
      return invalid_argument("port is missing in endpoint: " + cfg.rdzv_endpoint + ". Try to specify --master-port");
    }
  }
  if (!cfg.rdzv_conf.count("timeout")) cfg.rdzv_conf["timeout"] = "900";
  auto options = resolve_rendezvous_options(cfg.rdzv_conf, cfg.rdzv_backend == "static", cfg.warnings);
  if (!options.ok()) return options.status();
  cfg.rdzv = options.value();
  return {};
}

// --max-restarts and --monitor-interval.
Status parse_restart_policy(const ParsedArgs& args, LaunchConfig& cfg) {
  auto restarts = parse_python_int(get(args, "max_restarts"));
  if (*restarts < 0) return invalid_argument("max_restarts must be >= 0");
  if (*restarts > std::numeric_limits<int>::max()) {
    return invalid_argument("max_restarts must be at most " + std::to_string(std::numeric_limits<int>::max()));
  }
  cfg.max_restarts = static_cast<int>(*restarts);
  cfg.monitor_interval = *parse_python_float(get(args, "monitor_interval"));
  if (!(cfg.monitor_interval > 0)) return invalid_argument("monitor_interval must be > 0");
  return {};
}

// --nproc-per-node: a number, cpu, gpu or auto.
Status parse_nproc_per_node(const std::string& v, const HostFacts& host, LaunchConfig& cfg) {
  if (auto n = parse_python_int(v)) {
    if (*n <= 0) return invalid_argument("--nproc-per-node must be positive, got " + v);
    if (*n > rendezvous::kMaxLocalWorldSize) {
      return invalid_argument("--nproc-per-node=" + v + ": a node runs at most " +
                              std::to_string(rendezvous::kMaxLocalWorldSize) + " workers");
    }
    cfg.nproc_per_node = static_cast<int>(*n);
  } else if (v == "cpu") {
    cfg.nproc_per_node = host.cpu_count;
  } else if (v == "gpu") {
    auto gpus = host.gpu_count ? host.gpu_count() : Result<int>(0);
    if (!gpus.ok()) return gpus.status();
    if (gpus.value() == 0) {
      return invalid_argument(
          "--nproc-per-node=gpu: no NVIDIA GPU is visible on this machine (no /dev/nvidia* "
          "device, or CUDA_VISIBLE_DEVICES hides them all); give a number of workers instead");
    }
    cfg.nproc_per_node = gpus.value();
  } else if (v == "auto") {
    auto gpus = host.gpu_count ? host.gpu_count() : Result<int>(0);
    int n = gpus.ok() ? gpus.value() : 0;
    cfg.nproc_per_node = n > 0 ? n : host.cpu_count;
  } else {
    return invalid_argument("Unsupported nproc_per_node value: " + v + " (use a positive integer, cpu, gpu or auto)");
  }
  return {};
}

// Where the workers' output goes: --local-ranks-filter, -r/-t, the duplicate
// filters, --log-dir; and --local-addr and --role.
Status parse_output_options(const ParsedArgs& args, LaunchConfig& cfg) {
  if (std::string f = get(args, "local_ranks_filter"); !f.empty()) {
    auto bad = invalid_argument(
        "--local_ranks_filter must be a comma-separated list of integers e.g. --local_ranks_filter=0,1,2");
    std::set<int> ranks;
    std::stringstream ss(f);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto r = parse_python_int(item);
      if (!r) return bad;
      ranks.insert(static_cast<int>(*r));
    }
    if (f.back() == ',') return bad;
    cfg.local_ranks_filter = ranks;
  }

  auto redirects = StdSpec::parse(get(args, "redirects"));
  if (!redirects.ok()) return redirects.status();
  auto tee = StdSpec::parse(get(args, "tee"));
  if (!tee.ok()) return tee.status();
  cfg.redirects = redirects.value();
  cfg.tee = tee.value();
  cfg.duplicate_stdout_filters = split_filters(get(args, "duplicate_stdout_filters"));
  cfg.duplicate_stderr_filters = split_filters(get(args, "duplicate_stderr_filters"));

  if (has(args, "log_dir")) cfg.log_dir = get(args, "log_dir");
  if (has(args, "local_addr")) cfg.local_addr = get(args, "local_addr");
  cfg.role = get(args, "role");
  return {};
}

// --signals-to-handle: names torchrun cannot register are warned about and skipped, as torchrun does.
void parse_signals(const ParsedArgs& args, LaunchConfig& cfg) {
  cfg.signals_to_handle = get(args, "signals_to_handle");
  std::stringstream ss(cfg.signals_to_handle);
  std::string name;
  while (std::getline(ss, name, ',')) {
    name = trim(name);
    if (name.empty()) continue;
    auto signo = signal_from_name(name);
    if (!signo || *signo == SIGKILL || *signo == SIGSTOP) {
      cfg.warnings.push_back("Failed to register signal handler for " + name + ": not a signal that can be handled");
      continue;
    }
    cfg.signal_numbers.push_back(*signo);
  }
}

// The agent's own bounds and services: the shutdown timeout, the key file,
// the metrics listener, the worker timeout and torchrun's file-based watchdog.
Status parse_agent_options(const ParsedArgs& args, const Environment& env, const HostFacts& host,
                           LaunchConfig& cfg) {
  if (has(args, "shutdown_timeout")) {
    cfg.shutdown_timeout = static_cast<int>(*parse_python_int(get(args, "shutdown_timeout")));
  } else if (auto t = env_get(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"); t && !t->empty()) {
    auto v = parse_python_int(*t);
    if (!v) {
      return invalid_argument("TORCH_ELASTIC_SHUTDOWN_TIMEOUT='" + *t + "' is not an integer number of seconds");
    }
    cfg.shutdown_timeout = static_cast<int>(*v);
  }
  if (cfg.shutdown_timeout < 0) {
    return invalid_argument("shutdown_timeout must be non-negative, got " + std::to_string(cfg.shutdown_timeout));
  }
  cfg.virtual_local_rank = flag(args, "virtual_local_rank");
  if (has(args, "auth_key_file")) {
    cfg.auth_key_file = get(args, "auth_key_file");
    if (cfg.auth_key_file.empty()) return invalid_argument("--auth-key-file needs a path");
  }
  // muster's own options: the flag, else its variable (an empty one counts as unset).
  struct Given {
    std::string text;
    std::string from;  // the flag or the variable, for the error
  };
  auto flag_or_env = [&](const char* dest, const char* flag, const char* var) -> std::optional<Given> {
    if (has(args, dest)) return Given{get(args, dest), flag};
    if (auto v = env_get(env, var); v && !v->empty()) return Given{*v, var};
    return std::nullopt;
  };
  if (auto m = flag_or_env("metrics_listen", "--metrics-listen", "MUSTER_METRICS_LISTEN")) {
    if (m->text.empty()) return invalid_argument("--metrics-listen needs ADDR[:PORT]");
    cfg.metrics_listen = m->text;
  }
  if (auto t = flag_or_env("worker_timeout", "--worker-timeout", "MUSTER_WORKER_TIMEOUT")) {
    auto seconds = parse_worker_timeout(t->text);
    if (!seconds) {
      return invalid_argument(t->from + "='" + t->text + "': give the seconds a worker may go without progress, " +
                              "a number of at least 0.1 (0 turns the check off), e.g. --worker-timeout=600");
    }
    cfg.worker_timeout = *seconds;
  }
  if (auto h = flag_or_env("health_check", "--health-check", "MUSTER_HEALTH_CHECK")) {
    if (h->text.empty()) return invalid_argument("--health-check needs a command, e.g. --health-check=nvidia-smi");
    cfg.health_check = h->text;
  }
  if (auto t = flag_or_env("health_check_timeout", "--health-check-timeout", "MUSTER_HEALTH_CHECK_TIMEOUT")) {
    auto seconds = parse_worker_timeout(t->text);
    if (!seconds || seconds->count() == 0) {
      return invalid_argument(t->from + "='" + t->text + "': give the seconds one health check may take, " +
                              "a number of at least 0.1, e.g. --health-check-timeout=30");
    }
    cfg.health_check_timeout = *seconds;
  }
  if (auto t = flag_or_env("health_check_interval", "--health-check-interval", "MUSTER_HEALTH_CHECK_INTERVAL")) {
    auto seconds = parse_worker_timeout(t->text);
    if (!seconds || (seconds->count() > 0 && seconds->count() < 1000)) {
      return invalid_argument(t->from + "='" + t->text + "': give the seconds between health checks while the " +
                              "workers run, at least 1 (0 turns them off), e.g. --health-check-interval=300");
    }
    if (seconds->count() > 0 && cfg.health_check.empty()) {
      return invalid_argument(t->from + " needs a check to run: give --health-check=CMD too");
    }
    cfg.health_check_interval = *seconds;
  }
  if (auto c = flag_or_env("exclude_exit_code", "--exclude-exit-code", "MUSTER_EXCLUDE_EXIT_CODE")) {
    char* end = nullptr;
    errno = 0;
    long code = std::strtol(c->text.c_str(), &end, 10);
    if (c->text.empty() || *end != '\0' || errno == ERANGE || code < 1 || code > 255) {
      return invalid_argument(c->from + "='" + c->text + "': give the exit code (1-255) by which a worker asks " +
                              "for its node to be excluded, e.g. --exclude-exit-code=75");
    }
    cfg.exclude_exit_code = static_cast<int>(code);
  }
  // torchrun's watchdog: on with TORCHELASTIC_ENABLE_FILE_TIMER=1 exactly, its
  // pipe at TORCHELASTIC_TIMER_FILE or a fresh name in the temporary folder.
  if (env_get(env, "TORCHELASTIC_ENABLE_FILE_TIMER").value_or("") == "1") {
    auto file = env_get(env, "TORCHELASTIC_TIMER_FILE");
    std::string tmp = env_get(env, "TMPDIR").value_or("");
    if (file) {
      cfg.file_timer_path = *file;
    } else {
      auto id = fresh_run_id(host);
      if (!id.ok()) return id.status();
      cfg.file_timer_path = (tmp.empty() ? std::string("/tmp") : tmp) + "/watchdog_timer_" + id.value();
    }
    if (cfg.file_timer_path.empty()) {
      return invalid_argument("TORCHELASTIC_TIMER_FILE is set but empty: unset it for a fresh pipe in $TMPDIR, "
                              "or name a path for the watchdog's pipe");
    }
  }
  return {};
}

// The worker command. --run-path comes first: torchrun's function entrypoint
// ignores --no-python and -m.
Status build_worker_command(const ParsedArgs& args, const Environment& env, const HostFacts& host,
                            LaunchConfig& cfg) {
  cfg.run_path = flag(args, "run_path");
  cfg.start_method = get(args, "start_method");
  cfg.module = flag(args, "module") && !cfg.run_path;
  cfg.no_python = flag(args, "no_python") && !cfg.run_path;
  if (cfg.no_python && cfg.module) {
    return invalid_argument("Don't use both the '--no-python' flag and the '--module' flag at the same time.");
  }
  if (cfg.no_python) {
    cfg.executable = args.training_script;
    cfg.args = args.training_script_args;
    cfg.entrypoint_name = cfg.executable;
    return {};
  }
  // torchrun runs workers with its own interpreter (sys.executable); muster has
  // none, so: PYTHON_EXEC, else the Python of the environment muster was
  // installed into, else python3 from PATH.
  auto python = env_get(env, "PYTHON_EXEC");
  cfg.executable = python                              ? *python
                   : !host.environment_python.empty() ? host.environment_python
                                                       : "python3";
  // torchrun's interpreter is sys.executable, a full path: so is the one
  // reports name, once the agent has looked python3 up.
  cfg.python_from_path = !python && host.environment_python.empty();
  cfg.args = {"-u"};
  if (cfg.run_path) {
    // torchrun's run_script_path, in the worker's own interpreter: argv as the
    // script sees it, then runpy.run_path as __main__.
    cfg.args.push_back("-c");
    cfg.args.push_back(kRunScriptPath);
  } else if (cfg.module) {
    cfg.args.push_back("-m");
  }
  cfg.args.push_back(args.training_script);
  cfg.args.insert(cfg.args.end(), args.training_script_args.begin(), args.training_script_args.end());
  // torchrun names the job after the script unless an explicit interpreter was
  // given, and after the function for --run-path.
  cfg.entrypoint_name = cfg.run_path ? "run_script_path" : python ? *python : args.training_script;
  return {};
}

}  // namespace

std::optional<std::chrono::milliseconds> parse_worker_timeout(std::string_view text) {
  auto v = parse_python_float(text);
  if (!v || !std::isfinite(*v) || *v < 0 || *v > kMaxWorkerTimeoutSeconds) return std::nullopt;
  if (*v == 0) return std::chrono::milliseconds(0);
  auto ms = std::chrono::milliseconds(static_cast<long long>(*v * 1000 + 0.5));
  if (ms < kMinWorkerTimeout) return std::nullopt;
  return ms;
}

// torchrun's config_from_args, section by section; the order matters where a
// section reads what an earlier one set (the rendezvous needs max_nodes).
Result<LaunchConfig> resolve_config(const ParsedArgs& given, const Environment& env, const HostFacts& host) {
  LaunchConfig cfg;
  ParsedArgs args = given;
  if (auto st = apply_slurm(args, env, cfg.notices); !st.ok()) return st;
  // Inferred or not: srun gathers the output of a step's nodes into one stream.
  if (auto step = read_slurm_step(env); step.ok() && step.value() && step.value()->nodes > 1) {
    cfg.one_report_per_job = true;
  }
  if (auto st = refuse_python_plugins(args, cfg); !st.ok()) return st;
  if (auto st = parse_nnodes(get(args, "nnodes"), cfg); !st.ok()) return st;
  if (auto st = choose_rendezvous(args, host, cfg); !st.ok()) return st;
  if (auto st = parse_restart_policy(args, cfg); !st.ok()) return st;
  if (auto st = parse_nproc_per_node(get(args, "nproc_per_node"), host, cfg); !st.ok()) return st;
  cfg.set_omp_num_threads = !env.count("OMP_NUM_THREADS") && cfg.nproc_per_node > 1;
  if (auto st = parse_rendezvous_conf(args, cfg); !st.ok()) return st;
  if (auto st = parse_output_options(args, cfg); !st.ok()) return st;
  parse_signals(args, cfg);
  if (auto st = parse_agent_options(args, env, host, cfg); !st.ok()) return st;
  if (auto st = build_worker_command(args, env, host, cfg); !st.ok()) return st;
  return cfg;
}

}  // namespace muster::launcher
