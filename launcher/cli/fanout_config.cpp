#include "fanout_config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "launch_channel.hpp"
#include "torchrun_options.hpp"

namespace muster::launcher {
namespace {

Status invalid(const std::string& why) { return Status(Code::invalid_argument, why); }

// Given on the command line, or by its PET_ variable.
bool present(const ParsedArgs& args, const Environment& env, const std::string& dest, bool pet = true) {
  if (args.given.count(dest)) return true;
  return pet && args.values.count(dest) && env.count(argparse::pet_variable(dest));
}

std::optional<int> small_number(const std::string& s) {
  if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    return std::nullopt;
  }
  return std::stoi(s);
}

// Options the launching command sets per host or for the whole job, or keeps.
const std::set<std::string>& not_passed_on() {
  static const std::set<std::string> names = {
      "help", "version", "hostfile", "hosts", "include", "exclude", "export", "from_launcher", "nnodes",
      "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone", "node_rank",
      "master_addr", "master_port"};
  return names;
}

Status parse_nnodes_range(const std::string& text, int& lo, int& hi) {
  auto colon = text.find(':');
  auto a = small_number(text.substr(0, colon));
  auto b = colon == std::string::npos ? a : small_number(text.substr(colon + 1));
  if (!a || !b || *a < 1 || *a > *b) return invalid("--nnodes=" + text + " is not N or MIN:MAX with 0 < MIN <= MAX");
  lo = *a;
  hi = *b;
  return {};
}

bool valid_utf8(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += n;
  }
  return true;
}

bool default_export(const std::string& name) {
  if (std::find(kNeverExported.begin(), kNeverExported.end(), name) != kNeverExported.end()) return false;
  for (const auto& p : kDefaultExportPrefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

std::string find_on_path(const Environment& env, const std::string& program) {
  auto path = env.find("PATH");
  if (path == env.end()) return {};
  std::size_t pos = 0;
  const std::string& p = path->second;
  while (pos <= p.size()) {
    auto colon = p.find(':', pos);
    std::string dir = p.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (!dir.empty() && dir.front() == '/') {
      std::string candidate = dir + "/" + program;
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return {};
}

}  // namespace

bool wants_fanout(const ParsedArgs& args) { return args.values.count("hostfile") || args.values.count("hosts"); }

Result<std::map<std::string, std::string>> parse_env_file(const std::string& text, const std::string& path) {
  std::map<std::string, std::string> out;
  std::size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    line = line.substr(first);
    if (line.rfind("export ", 0) == 0) line = line.substr(7);
    auto eq = line.find('=');
    std::string name = line.substr(0, eq);
    if (eq == std::string::npos || !channel::valid_env_name(name)) {
      return invalid(path + ":" + std::to_string(line_no) + ": expected NAME=VALUE, got '" + line.substr(0, 80) + "'");
    }
    out[name] = line.substr(eq + 1);
    if (out.size() > channel::kMaxEnvEntries) return invalid(path + ": more than " + std::to_string(channel::kMaxEnvEntries) + " variables");
  }
  return out;
}

Result<FanoutConfig> resolve_fanout(const ParsedArgs& args, const Environment& env, const FanoutFacts& facts) {
  FanoutConfig fc;
  const bool file = args.values.count("hostfile") > 0;
  if (file && args.values.count("hosts")) return invalid("give --hostfile or --hosts, not both");
  if (args.flags.count("standalone") && args.flags.at("standalone")) {
    return invalid("--standalone runs one node; with --hostfile or --hosts the launching command hosts the job's "
                   "rendezvous itself");
  }
  if (present(args, env, "rdzv_backend") && args.values.at("rdzv_backend") != "c10d") {
    return invalid("--rdzv-backend=" + args.values.at("rdzv_backend") +
                   ": a launch with --hostfile or --hosts uses the c10d rendezvous (node ranks follow the host "
                   "list); leave --rdzv-backend out or give c10d");
  }
  if (args.given.count("node_rank")) {
    return invalid("--node-rank: with --hostfile or --hosts, node ranks follow the order of the host list");
  }
  if (args.values.count("from_launcher")) return invalid("--from-launcher is for agents a launch starts, not with --hostfile");

  auto listed = file ? read_host_file(args.values.at("hostfile")) : parse_hosts_option(args.values.at("hosts"));
  if (!listed.ok()) return listed.status();

  std::optional<std::string> nproc;
  if (present(args, env, "nproc_per_node")) nproc = args.values.at("nproc_per_node");
  std::optional<int> default_slots = small_number(nproc.value_or("1"));
  auto get = [&](const char* dest) { return args.values.count(dest) ? args.values.at(dest) : std::string(); };
  auto hosts = select_hosts(std::move(listed.value()), get("include"), get("exclude"), default_slots);
  if (!hosts.ok()) return hosts.status();

  int order = 0;
  for (auto& h : hosts.value()) {
    RemoteHost r;
    r.order = order++;
    if (h.chosen_slots) {
      r.nproc_per_node = std::to_string(h.chosen_slots->size());
      std::string ids;
      for (int id : *h.chosen_slots) ids += (ids.empty() ? "" : ",") + std::to_string(id);
      r.cuda_visible_devices = ids;
    } else if (h.slots && !nproc) {
      r.nproc_per_node = std::to_string(*h.slots);
    } else {
      r.nproc_per_node = nproc.value_or("1");
    }
    r.entry = std::move(h);
    fc.hosts.push_back(std::move(r));
  }
  const int n = static_cast<int>(fc.hosts.size());
  fc.min_nodes = fc.max_nodes = n;
  if (present(args, env, "nnodes")) {
    if (auto st = parse_nnodes_range(args.values.at("nnodes"), fc.min_nodes, fc.max_nodes); !st.ok()) return st;
    if (n < fc.min_nodes || n > fc.max_nodes) {
      return invalid("--nnodes=" + args.values.at("nnodes") + " does not admit the " + std::to_string(n) +
                     " hosts given: give --nnodes a range that holds " + std::to_string(n) +
                     ", or leave it out (it defaults to the number of hosts)");
    }
  }

  // The rest of the command line, checked as each remote agent will check it.
  ParsedArgs as_remote = args;
  as_remote.values["nnodes"] = std::to_string(fc.min_nodes) + ":" + std::to_string(fc.max_nodes);
  as_remote.values["rdzv_backend"] = "c10d";
  as_remote.values["rdzv_endpoint"] = "127.0.0.1:29400";
  as_remote.values["rdzv_id"] = "check";
  auto first_nproc = small_number(fc.hosts.front().nproc_per_node);
  as_remote.values["nproc_per_node"] = first_nproc ? fc.hosts.front().nproc_per_node : "1";
  auto checked = resolve_config(as_remote, env, facts.host);
  if (!checked.ok()) return checked.status();
  fc.shutdown_timeout = checked->shutdown_timeout;

  if (present(args, env, "rdzv_id")) {
    fc.rdzv_id = args.values.at("rdzv_id");
  } else {
    if (!facts.host.new_run_id) return invalid("no run id");
    auto id = facts.host.new_run_id();
    if (!id.ok()) return id.status();
    fc.rdzv_id = id.value();
  }
  if (present(args, env, "rdzv_endpoint")) fc.rdzv_endpoint = args.values.at("rdzv_endpoint");
  if (present(args, env, "rdzv_conf")) fc.rdzv_conf = args.values.at("rdzv_conf");

  fc.agent_args.push_back("--nnodes=" + std::to_string(fc.min_nodes) + ":" + std::to_string(fc.max_nodes));
  fc.agent_args.push_back("--rdzv-backend=c10d");
  fc.agent_args.push_back("--rdzv-id=" + fc.rdzv_id);
  for (const auto& doc : option_docs()) {
    if (not_passed_on().count(doc.dest)) continue;
    std::string name;
    for (const auto& n2 : doc.names) {
      if (n2.rfind("--", 0) == 0) {
        name = n2;
        break;
      }
    }
    if (name.empty()) continue;
    if (doc.metavar.empty()) {
      if (args.flags.count(doc.dest) && args.flags.at(doc.dest)) fc.agent_args.push_back(name);
    } else if (present(args, env, doc.dest, doc.pet)) {
      fc.agent_args.push_back(name + "=" + args.values.at(doc.dest));
    }
  }
  // Each line of a remote worker comes back with its rank, as --tee gives it.
  if (!present(args, env, "tee") && !present(args, env, "redirects")) fc.agent_args.push_back("--tee=3");
  fc.command.push_back(args.training_script);
  for (const auto& a : args.training_script_args) fc.command.push_back(a);

  // The environment carried over.
  for (const auto& [name, value] : env) {
    if (default_export(name)) {
      fc.exports[name] = value;
    }
  }
  if (!fc.exports.empty()) {
    std::string names;
    for (const auto& [name, value] : fc.exports) names += (names.empty() ? "" : " ") + name;
    fc.export_sources.push_back(names + " (by default)");
  }
  std::vector<std::string> env_files;
  if (!facts.home.empty()) env_files.push_back(facts.home + "/" + kEnvFileName);
  env_files.push_back(facts.working_dir + "/" + kEnvFileName);
  if (env_files.size() == 2 && env_files[0] == env_files[1]) env_files.pop_back();
  for (const auto& path : env_files) {
    auto text = facts.read_file ? facts.read_file(path) : std::nullopt;
    if (!text) continue;
    auto vars = parse_env_file(*text, path);
    if (!vars.ok()) return vars.status();
    std::string names;
    for (const auto& [name, value] : vars.value()) {
      fc.exports[name] = value;
      names += (names.empty() ? "" : " ") + name;
    }
    if (!names.empty()) fc.export_sources.push_back(names + " (from " + path + ")");
  }
  if (args.lists.count("export")) {
    std::string names;
    for (const auto& item : args.lists.at("export")) {
      auto eq = item.find('=');
      std::string name = item.substr(0, eq);
      if (!channel::valid_env_name(name)) {
        return invalid("--export " + item + ": '" + name + "' is not a variable name (letters, digits, '_')");
      }
      if (eq != std::string::npos) {
        fc.exports[name] = item.substr(eq + 1);
      } else if (auto it = env.find(name); it != env.end()) {
        fc.exports[name] = it->second;
      } else {
        return invalid("--export " + name + ": " + name + " is not set here; give --export " + name + "=VALUE");
      }
      names += (names.empty() ? "" : " ") + name;
    }
    fc.export_sources.push_back(names + " (--export)");
  }
  if (!checked->no_python && !fc.exports.count("PYTHON_EXEC")) {
    // The same Python on every host, as the launching host would run it.
    std::string python = checked->executable;
    if (checked->python_from_path) python = find_on_path(env, checked->executable);
    if (!python.empty() && python.front() == '/') {
      fc.exports["PYTHON_EXEC"] = python;
      fc.export_sources.push_back("PYTHON_EXEC=" + python + " (the launching host's Python)");
    }
  }
  if (fc.exports.size() > channel::kMaxEnvEntries) {
    return invalid("more than " + std::to_string(channel::kMaxEnvEntries) + " variables to carry to the hosts");
  }
  std::size_t total = 0;
  for (const auto& [name, value] : fc.exports) {
    if (!valid_utf8(value)) {
      return invalid("the value of " + name + " is not UTF-8 text, which the launch cannot carry to the hosts; "
                     "unset it or give it with --export " + name + "=VALUE");
    }
    total += name.size() + value.size() + 8;
  }
  if (total > channel::kMaxHeaderBytes / 2) {
    return invalid("the variables to carry to the hosts take " + std::to_string(total) + " bytes, more than " +
                   std::to_string(channel::kMaxHeaderBytes / 2) + "; carry fewer (docs/launching.md lists the defaults)");
  }

  fc.working_dir = facts.working_dir;
  fc.muster_path = facts.muster_path;
  if (auto remote = env.find("MUSTER_REMOTE_PATH"); remote != env.end() && !remote->second.empty()) {
    fc.muster_path = remote->second;
  }
  if (auto ssh = env.find("MUSTER_SSH"); ssh != env.end() && !ssh->second.empty()) {
    fc.ssh = {"/bin/sh", "-c", "exec " + ssh->second + " \"$@\"", "muster-ssh"};
  } else {
    fc.ssh = {"ssh"};
  }
  if (auto f = env.find("MUSTER_SSH_FANOUT"); f != env.end()) {
    auto v = small_number(f->second);
    if (!v || *v < 1 || *v > kMaxFanout) {
      return invalid("MUSTER_SSH_FANOUT='" + f->second + "' is not a number from 1 to " + std::to_string(kMaxFanout));
    }
    fc.fanout = *v;
  }
  return fc;
}

}  // namespace muster::launcher

namespace muster::launcher {

std::string shell_quote(const std::string& word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string remote_command(const FanoutConfig& fc, const std::vector<std::string>& agent_args) {
  const std::string script =
      "d=$1; p=$2; shift 2; "
      "cd -- \"$d\" 2>/dev/null || { echo \"muster: error: the working directory $d does not exist on $(hostname) "
      "(a launch runs in the launching command's directory on every host: create it there, or launch from a "
      "directory every host has)\" >&2; exit " + std::to_string(kExitNoDirectory) + "; }; "
      "m=$p; if [ ! -x \"$m\" ]; then m=$(command -v muster 2>/dev/null) || { echo \"muster: error: muster is not "
      "installed on $(hostname): neither $p nor muster on PATH (install the same muster on every host)\" >&2; "
      "exit " + std::to_string(kExitNoMuster) + "; }; fi; exec \"$m\" \"$@\"";
  std::string cmd = "exec /bin/sh -c " + shell_quote(script) + " muster " + shell_quote(fc.working_dir) + " " +
                    shell_quote(fc.muster_path);
  for (const auto& a : agent_args) cmd += " " + shell_quote(a);
  return cmd;
}

std::vector<std::string> ssh_argv(const FanoutConfig& fc, const RemoteHost& host, const std::string& command) {
  std::vector<std::string> argv = fc.ssh;
  for (const char* opt : {"-T", "-x", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5",
                          "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"}) {
    argv.emplace_back(opt);
  }
  argv.emplace_back("--");  // the host is never taken for an option
  argv.push_back(host.entry.target);
  argv.push_back(command);
  return argv;
}

}  // namespace muster::launcher
