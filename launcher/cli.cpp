#include "cli.hpp"
#include "progress_watch.hpp"
#include "slurm.hpp"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "muster/common/endpoint.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "rdzv_conf.hpp"
#include "signals.hpp"

namespace muster::launcher {
namespace {

enum class Kind { value, flag, help, version };
enum class Type { str, integer, real };

struct OptionSpec {
  std::vector<std::string> names;  // in argparse order: short, then dashed long, then alias
  Kind kind = Kind::value;
  Type type = Type::str;
  bool pet = true;                          // reads PET_<DEST>
  std::optional<std::string> default_value;  // nullopt: None
  std::vector<std::string> choices;
  std::string help;

  // argparse's dest: the first long option string, dashes to underscores.
  std::string dest() const {
    for (const auto& n : names) {
      if (n.rfind("--", 0) == 0) {
        std::string d = n.substr(2);
        std::replace(d.begin(), d.end(), '-', '_');
        return d;
      }
    }
    return names.front().substr(1);
  }
  std::string display() const {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : "/") + n;
    return out;
  }
  std::string metavar() const {
    std::string d = dest();
    for (auto& c : d) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return d;
  }
};

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
       "Event log handler; muster supports 'null'."},
      {{"--role"}, Kind::value, Type::str, true, "default", {}, "User-defined role for the workers."},
      {{"-m", "--module"}, Kind::flag, Type::str, true, std::nullopt, {},
       "Run the training script as a Python module (python -m)."},
      {{"--no-python", "--no_python"}, Kind::flag, Type::str, true, std::nullopt, {},
       "Execute the training script directly instead of through python."},
      {{"--run-path", "--run_path"}, Kind::flag, Type::str, true, std::nullopt, {},
       "Not supported: muster runs the script as a program."},
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
       {"node", "socket", "exclusive", "core-complex"}, "Not supported yet."},
      {{"--signals-to-handle", "--signals_to_handle"}, Kind::value, Type::str, true,
       "SIGTERM,SIGINT,SIGHUP,SIGQUIT", {},
       "Comma list of signals the agent forwards to the workers."},
      {{"--shutdown-timeout", "--shutdown_timeout"}, Kind::value, Type::integer, true, std::nullopt, {},
       "Seconds between the stop signal and SIGKILL (default: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30)."},
      {{"--virtual-local-rank", "--virtual_local_rank"}, Kind::flag, Type::str, true, std::nullopt, {},
       "LOCAL_RANK=0 for every worker, each worker seeing its own CUDA_VISIBLE_DEVICES entry."},
      {{"--auth-key-file", "--auth_key_file"}, Kind::value, Type::str, false, std::nullopt, {},
       "A file holding the rendezvous's shared secret (default: $MUSTER_AUTH_KEY_FILE, then systemd's "
       "credential muster-auth-key); every agent of the job and its rendezvous need the same one."},
      {{"--metrics-listen", "--metrics_listen"}, Kind::value, Type::str, false, std::nullopt, {},
       "ADDR[:PORT] to serve the agent's Prometheus metrics on (GET /metrics; port 9401 by default; "
       "default: $MUSTER_METRICS_LISTEN, else none)."},
      {{"--worker-timeout", "--worker_timeout"}, Kind::value, Type::str, false, std::nullopt, {},
       "Seconds a worker may go without progress (a byte on stdout or stderr, a request on the store this "
       "agent hosts, a file-timer request) before it is taken for hung and the group fails as on a crash "
       "(default: $MUSTER_WORKER_TIMEOUT, else 0: never)."},
  };
  return table;
}

const OptionSpec* find_exact(const std::string& name) {
  for (const auto& spec : option_table()) {
    if (std::find(spec.names.begin(), spec.names.end(), name) != spec.names.end()) return &spec;
  }
  return nullptr;
}

bool is_negative_number(const std::string& s) {
  if (s.size() < 2 || s[0] != '-') return false;
  std::size_t i = 1;
  bool digits = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) { ++i; digits = true; }
  if (i == s.size()) return digits;
  if (s[i] != '.') return false;
  ++i;
  bool frac = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) { ++i; frac = true; }
  return i == s.size() && frac;
}

struct Match {
  const OptionSpec* spec = nullptr;
  std::string option_string;
  std::optional<std::string> explicit_arg;
};

// argparse's _parse_optional: nullopt means "a positional argument".
Result<std::optional<Match>> classify(const std::string& arg) {
  using Out = std::optional<Match>;
  if (arg.empty() || arg[0] != '-' || arg == "-") return Out{};
  if (const auto* spec = find_exact(arg)) return Out{Match{spec, arg, std::nullopt}};
  if (auto eq = arg.find('='); eq != std::string::npos) {
    std::string name = arg.substr(0, eq);
    if (const auto* spec = find_exact(name)) return Out{Match{spec, name, arg.substr(eq + 1)}};
  }
  std::vector<Match> tuples;
  if (arg.rfind("--", 0) == 0) {
    auto eq = arg.find('=');
    std::string prefix = eq == std::string::npos ? arg : arg.substr(0, eq);
    std::optional<std::string> explicit_arg;
    if (eq != std::string::npos) explicit_arg = arg.substr(eq + 1);
    for (const auto& spec : option_table()) {
      for (const auto& n : spec.names) {
        if (n.rfind(prefix, 0) == 0) tuples.push_back({&spec, n, explicit_arg});
      }
    }
  } else {
    std::string short_prefix = arg.substr(0, 2);
    std::string short_explicit = arg.substr(2);
    for (const auto& spec : option_table()) {
      for (const auto& n : spec.names) {
        if (n == short_prefix) tuples.push_back({&spec, n, short_explicit});
        else if (n.rfind(arg, 0) == 0) tuples.push_back({&spec, n, std::nullopt});
      }
    }
  }
  if (tuples.size() > 1) {
    std::string names;
    for (const auto& t : tuples) names += (names.empty() ? "" : ", ") + t.option_string;
    return invalid_argument("ambiguous option: " + arg.substr(0, arg.find('=')) + " could match " + names);
  }
  if (tuples.size() == 1) return Out{tuples.front()};
  if (is_negative_number(arg)) return Out{};
  if (arg.find(' ') != std::string::npos) return Out{};
  return Out{Match{nullptr, arg, std::nullopt}};
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// Python int(): surrounding whitespace, a sign, digits with single underscores between.
std::optional<long long> parse_python_int(std::string_view text) {
  std::string s = trim(text);
  std::size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) return std::nullopt;
  long long value = 0;
  bool last_digit = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_' && last_digit && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      last_digit = false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    if (value > (1LL << 52)) return std::nullopt;
    value = value * 10 + (c - '0');
    last_digit = true;
  }
  return negative ? -value : value;
}

std::optional<double> parse_python_float(std::string_view text) {
  std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
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

namespace {

Status check_type(const OptionSpec& spec, const std::string& value) {
  if (spec.type == Type::integer && !parse_python_int(value)) {
    return invalid_argument("argument " + spec.display() + ": invalid int value: '" + value + "'");
  }
  if (spec.type == Type::real && !parse_python_float(value)) {
    return invalid_argument("argument " + spec.display() + ": invalid float value: '" + value + "'");
  }
  return {};
}

}  // namespace

Result<ParsedArgs> parse_args(const std::vector<std::string>& argv, const Environment& env) {
  ParsedArgs out;
  std::vector<std::string> unrecognized;
  bool end_of_options = false;
  bool saw_script = false;
  std::size_t i = 0;
  auto next_is_value = [&](std::size_t j) -> Result<bool> {
    if (j >= argv.size()) return false;
    if (argv[j] == "--") return false;
    auto c = classify(argv[j]);
    if (!c.ok()) return c.status();
    return !c.value().has_value();
  };

  while (i < argv.size()) {
    const std::string& arg = argv[i];
    if (!end_of_options && arg == "--") {
      end_of_options = true;
      ++i;
      continue;
    }
    std::optional<Match> match;
    if (!end_of_options) {
      auto c = classify(arg);
      if (!c.ok()) return c.status();
      match = c.value();
    }
    if (!match) {
      saw_script = true;
      out.training_script = arg;
      out.training_script_args.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
      i = argv.size();
      break;
    }
    if (match->spec == nullptr) {
      unrecognized.push_back(arg);
      ++i;
      continue;
    }
    ++i;
    // Short flags may be bundled: -mh, or -m followed by a short valued option.
    while (true) {
      const OptionSpec& spec = *match->spec;
      if (spec.kind == Kind::value) {
        std::string value;
        if (match->explicit_arg) {
          value = *match->explicit_arg;
        } else {
          auto has = next_is_value(i);
          if (!has.ok()) return has.status();
          if (!has.value()) return invalid_argument("argument " + spec.display() + ": expected one argument");
          value = argv[i++];
        }
        if (auto st = check_type(spec, value); !st.ok()) return st;
        if (!spec.choices.empty() &&
            std::find(spec.choices.begin(), spec.choices.end(), value) == spec.choices.end()) {
          std::string list;
          for (const auto& c : spec.choices) list += (list.empty() ? "'" : ", '") + c + "'";
          return invalid_argument("argument " + spec.display() + ": invalid choice: '" + value +
                                  "' (choose from " + list + ")");
        }
        out.values[spec.dest()] = value;
        out.given[spec.dest()] = true;
        break;
      }
      // A flag or -h.
      if (spec.kind == Kind::help) {
        out.help = true;
      } else if (spec.kind == Kind::version) {
        out.version = true;
      } else {
        out.flags[spec.dest()] = true;
        out.given[spec.dest()] = true;
      }
      if (!match->explicit_arg) break;
      const std::string& rest = *match->explicit_arg;
      bool is_short = match->option_string.size() == 2 && match->option_string[1] != '-';
      if (is_short && !rest.empty()) {
        std::string next = std::string("-") + rest[0];
        if (const auto* next_spec = find_exact(next)) {
          std::optional<std::string> explicit_arg;
          if (rest.size() > 1) explicit_arg = rest.substr(1);
          match = Match{next_spec, next, explicit_arg};
          continue;
        }
      }
      return invalid_argument("argument " + spec.display() + ": ignored explicit argument '" + rest + "'");
    }
    if (out.help || out.version) return out;
  }

  if (!saw_script) {
    return invalid_argument("the following arguments are required: training_script, training_script_args");
  }
  if (!unrecognized.empty()) {
    std::string joined;
    for (const auto& u : unrecognized) joined += (joined.empty() ? "" : " ") + u;
    return invalid_argument("unrecognized arguments: " + joined);
  }

  // Defaults: PET_<DEST> when set, else the coded default; type applied as argparse does.
  for (const auto& spec : option_table()) {
    const std::string dest = spec.dest();
    std::string pet_name = "PET_" + dest;
    for (auto& c : pet_name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    auto env_it = spec.pet ? env.find(pet_name) : env.end();
    if (spec.kind == Kind::flag) {
      if (out.flags.count(dest)) continue;
      bool value = false;
      if (env_it != env.end()) {
        auto parsed = parse_python_int(env_it->second);
        if (!parsed) {
          return invalid_argument("the environment variable " + pet_name + "='" + env_it->second +
                                  "' must be an integer (0 or 1), as torchrun requires");
        }
        value = *parsed != 0;
      }
      out.flags[dest] = value;
      continue;
    }
    if (spec.kind != Kind::value || out.values.count(dest)) continue;
    if (env_it != env.end()) {
      if (auto st = check_type(spec, env_it->second); !st.ok()) return st;
      out.values[dest] = env_it->second;
    } else if (spec.default_value) {
      out.values[dest] = *spec.default_value;
    }
  }
  return out;
}

namespace {

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
    if (args.given.count(dest) > 0) return true;
    std::string pet = "PET_" + dest;
    for (auto& c : pet) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return env.count(pet) > 0;
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

}  // namespace

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

Result<LaunchConfig> resolve_config(const ParsedArgs& given, const Environment& env, const HostFacts& host) {
  LaunchConfig cfg;
  ParsedArgs args = given;
  if (auto st = apply_slurm(args, env, cfg.notices); !st.ok()) return st;
  // Inferred or not: srun gathers the output of a step's nodes into one stream.
  if (auto step = read_slurm_step(env); step.ok() && step.value() && step.value()->nodes > 1) {
    cfg.one_report_per_job = true;
  }

  // Options that only make sense inside a Python launcher.
  // torchrun's default LogsSpecs is registered as "default": the layout muster
  // writes. Any other name is a Python plugin class.
  if (has(args, "logs_specs") && get(args, "logs_specs") != "default") {
    return invalid_argument("Could not find entrypoint under 'torchrun.logs_specs[" + get(args, "logs_specs") +
                            "]' key: muster has torchrun's 'default' only (a LogsSpecs plugin is a Python class, "
                            "which a native launcher cannot load); use --log-dir, -r/--redirects, -t/--tee and "
                            "--local-ranks-filter instead");
  }
  if (has(args, "numa_binding")) {
    return invalid_argument(
        "--numa-binding is not supported by muster yet; bind each worker yourself, e.g. "
        "--no-python numactl --cpunodebind=N --membind=N python -u train.py");
  }
  // torch's registered handlers (torch/distributed/elastic/events/handlers.py).
  cfg.event_log_handler = get(args, "event_log_handler");
  if (cfg.event_log_handler != "null" && cfg.event_log_handler != "console" &&
      cfg.event_log_handler != "dynamic_rendezvous") {
    return invalid_argument("--event-log-handler='" + cfg.event_log_handler +
                            "' is not a registered event handler: use null, console or dynamic_rendezvous");
  }

  std::string backend = get(args, "rdzv_backend");
  std::string endpoint = get(args, "rdzv_endpoint");
  std::string run_id = get(args, "rdzv_id");
  cfg.standalone = flag(args, "standalone");

  // nnodes first: the single-node rewrite below needs max_nodes.
  {
    std::string text = get(args, "nnodes");
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
  }

  if (cfg.standalone) {
    backend = "c10d";
    endpoint = "localhost:0";
    run_id = host.new_run_id ? host.new_run_id() : "standalone";
  } else if (backend == "static" && endpoint.empty() && !has(args, "master_port") && cfg.max_nodes == 1) {
    // A plain single-node launch gets a private rendezvous on a free port, as torchrun does.
    backend = "c10d";
    endpoint = "localhost:0";
    run_id = host.new_run_id ? host.new_run_id() : "standalone";
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

  auto restarts = parse_python_int(get(args, "max_restarts"));
  if (*restarts < 0) return invalid_argument("max_restarts must be >= 0");
  if (*restarts > std::numeric_limits<int>::max()) {
    return invalid_argument("max_restarts must be at most " + std::to_string(std::numeric_limits<int>::max()));
  }
  cfg.max_restarts = static_cast<int>(*restarts);
  cfg.monitor_interval = *parse_python_float(get(args, "monitor_interval"));
  if (!(cfg.monitor_interval > 0)) return invalid_argument("monitor_interval must be > 0");

  // nproc-per-node.
  {
    std::string v = get(args, "nproc_per_node");
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
      return invalid_argument("Unsupported nproc_per_node value: " + v +
                              " (use a positive integer, cpu, gpu or auto)");
    }
  }

  cfg.set_omp_num_threads = !env.count("OMP_NUM_THREADS") && cfg.nproc_per_node > 1;

  auto conf = parse_rdzv_conf(get(args, "rdzv_conf"));
  if (!conf.ok()) return conf.status();
  cfg.rdzv_conf = conf.value();
  {
    long long rank = *parse_python_int(get(args, "node_rank"));
    bool fits = rank >= 0 && rank < rendezvous::kMaxNodes;
    if (!fits && cfg.rdzv_backend == "static") {
      return invalid_argument("--node-rank=" + std::to_string(rank) + " is not in [0, " +
                              std::to_string(rendezvous::kMaxNodes) + ")");
    }
    cfg.node_rank = fits ? static_cast<int>(rank) : 0;  // other backends ignore it
  }
  if (cfg.rdzv_backend == "static") {
    cfg.rdzv_conf["rank"] = std::to_string(cfg.node_rank);
    if (endpoint.empty()) {
      std::string addr = cfg.master_addr;
      endpoint = addr + ":" + std::to_string(cfg.master_port);
    }
  }
  if (!cfg.rdzv_conf.count("timeout")) cfg.rdzv_conf["timeout"] = "900";
  cfg.rdzv_endpoint = endpoint;

  if (std::string f = get(args, "local_ranks_filter"); !f.empty()) {
    std::set<int> ranks;
    std::stringstream ss(f);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto r = parse_python_int(item);
      if (!r) {
        return invalid_argument(
            "--local_ranks_filter must be a comma-separated list of integers e.g. --local_ranks_filter=0,1,2");
      }
      ranks.insert(static_cast<int>(*r));
    }
    if (!f.empty() && f.back() == ',') {
      return invalid_argument(
          "--local_ranks_filter must be a comma-separated list of integers e.g. --local_ranks_filter=0,1,2");
    }
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

  cfg.signals_to_handle = get(args, "signals_to_handle");
  {
    std::stringstream ss(cfg.signals_to_handle);
    std::string name;
    while (std::getline(ss, name, ',')) {
      name = trim(name);
      if (name.empty()) continue;
      auto signo = signal_from_name(name);
      if (!signo || *signo == SIGKILL || *signo == SIGSTOP) {
        // torchrun warns and carries on without it; so does muster.
        cfg.warnings.push_back("Failed to register signal handler for " + name +
                               ": not a signal that can be handled");
        continue;
      }
      cfg.signal_numbers.push_back(*signo);
    }
  }

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
  if (has(args, "metrics_listen")) {
    cfg.metrics_listen = get(args, "metrics_listen");
    if (cfg.metrics_listen.empty()) return invalid_argument("--metrics-listen needs ADDR[:PORT]");
  } else if (auto m = env_get(env, "MUSTER_METRICS_LISTEN"); m && !m->empty()) {
    cfg.metrics_listen = *m;
  }
  {
    std::optional<std::string> text;
    std::string from = "--worker-timeout";
    if (has(args, "worker_timeout")) {
      text = get(args, "worker_timeout");
    } else if (auto t = env_get(env, "MUSTER_WORKER_TIMEOUT"); t && !t->empty()) {
      text = *t;
      from = "MUSTER_WORKER_TIMEOUT";
    }
    if (text) {
      auto seconds = parse_worker_timeout(*text);
      if (!seconds) {
        return invalid_argument(from + "='" + *text + "': give the seconds a worker may go without progress, " +
                                "a number of at least 0.1 (0 turns the check off), e.g. --worker-timeout=600");
      }
      cfg.worker_timeout = *seconds;
    }
  }
  // torchrun's watchdog: on with TORCHELASTIC_ENABLE_FILE_TIMER=1 exactly, its
  // pipe at TORCHELASTIC_TIMER_FILE or a fresh name in the temporary folder.
  if (env_get(env, "TORCHELASTIC_ENABLE_FILE_TIMER").value_or("") == "1") {
    auto file = env_get(env, "TORCHELASTIC_TIMER_FILE");
    std::string tmp = env_get(env, "TMPDIR").value_or("");
    cfg.file_timer_path = file ? *file : (tmp.empty() ? std::string("/tmp") : tmp) + "/watchdog_timer_" + host.new_run_id();
    if (cfg.file_timer_path.empty()) {
      return invalid_argument("TORCHELASTIC_TIMER_FILE is set but empty: unset it for a fresh pipe in $TMPDIR, "
                              "or name a path for the watchdog's pipe");
    }
  }

  // The worker command. --run-path comes first: torchrun's function entrypoint
  // ignores --no-python and -m.
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
  } else {
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
  }
  return cfg;
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

std::string usage_text(const std::string& prog) {
  std::string head = "usage: " + prog + " ";
  std::string indent(head.size(), ' ');
  std::vector<std::string> pieces;
  for (const auto& spec : option_table()) {
    const std::string& first = spec.names.size() > 1 && spec.names[0].size() == 2 ? spec.names[0]
                                                                                 : spec.names[0];
    if (spec.kind == Kind::value) {
      std::string mv = spec.metavar();
      if (!spec.choices.empty()) {
        mv = "{";
        for (std::size_t k = 0; k < spec.choices.size(); ++k) mv += (k ? "," : "") + spec.choices[k];
        mv += "}";
      }
      pieces.push_back("[" + first + " " + mv + "]");
    } else {
      pieces.push_back("[" + first + "]");
    }
  }
  pieces.push_back("training_script ...");
  std::string out = head;
  std::size_t col = head.size();
  bool first_piece = true;
  for (const auto& p : pieces) {
    if (!first_piece && col + 1 + p.size() > 79) {
      out += "\n" + indent;
      col = indent.size();
    } else if (!first_piece) {
      out += " ";
      ++col;
    }
    out += p;
    col += p.size();
    first_piece = false;
  }
  return out + "\n";
}

std::string help_text(const std::string& prog) {
  std::string out = usage_text(prog);
  out +=
      "\nmuster: the torchrun-compatible launcher for distributed training. Every torchrun option also\n"
      "reads its default from PET_<NAME> (e.g. PET_NPROC_PER_NODE); muster's own (--auth-key-file,\n"
      "--metrics-listen) read the MUSTER_* variable their help names.\n\n"
      "positional arguments:\n"
      "  training_script       the program or script to run in every worker, followed by its arguments\n"
      "  training_script_args\n\noptions:\n";
  for (const auto& spec : option_table()) {
    std::string names;
    for (const auto& n : spec.names) {
      names += (names.empty() ? "" : ", ") + n;
      if (spec.kind == Kind::value) names += " " + spec.metavar();
    }
    out += "  " + names + "\n                        " + spec.help + "\n";
  }
  return out;
}

}  // namespace muster::launcher
