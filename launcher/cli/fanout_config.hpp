// What `muster --hostfile` / `--hosts` means once resolved: the hosts, in
// host-file order, and what every remote agent is started with (pure but for
// reading the host file and the .muster_env files).
//
// Contract. The rest of the command line is torchrun's and is checked here
// the way each remote agent will check it, so a mistake is said once, before
// any ssh connection. Every remote agent runs the c10d rendezvous with the
// same --rdzv-id (a fresh one unless given), --nnodes (the number of hosts
// unless given) and, per host, --nproc-per-node (the host's slots where the
// command line gives none). The environment carried to every host is: the
// variables named by kDefaultExportPrefixes (less kNeverExported), then the
// .muster_env files (~ first, then the working directory's), then --export,
// each later one winning; PYTHON_EXEC names the launching host's Python when
// the job runs Python and it is not set already.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "argparse.hpp"
#include "config_from_args.hpp"
#include "host_list.hpp"

namespace muster::launcher {

// Variables carried by default: these prefixes (and names).
inline const std::vector<std::string> kDefaultExportPrefixes = {
    "NCCL_", "CUDA_", "PYTHON", "TORCH_", "UCX_", "FI_", "MLFLOW_", "MV2_", "OMP_NUM_THREADS", "HF_"};
// Never carried unless --export names them: they describe one host.
inline const std::vector<std::string> kNeverExported = {"CUDA_VISIBLE_DEVICES", "PYTHONHOME"};
// The file of NAME=VALUE lines carried to every host, read from ~ and from the
// working directory (DeepSpeed's .deepspeed_env, under muster's name).
constexpr const char* kEnvFileName = ".muster_env";
// ssh connections set up at once (pdsh's default fan-out), unless
// MUSTER_SSH_FANOUT says otherwise.
constexpr int kDefaultFanout = 32;
constexpr int kMaxFanout = 1024;

struct RemoteHost {
  HostEntry entry;
  int order = 0;               // place in the host file (after --include/--exclude)
  std::string nproc_per_node;  // what its agent is given
  std::optional<std::string> cuda_visible_devices;  // its chosen slots
};

struct FanoutConfig {
  std::vector<RemoteHost> hosts;
  int min_nodes = 1;
  int max_nodes = 1;
  std::string rdzv_id;
  std::string rdzv_endpoint;  // "" : the launching command hosts the rendezvous
  std::string rdzv_conf;      // as given
  int shutdown_timeout = 30;
  // The options every remote agent gets (less --nproc-per-node, the
  // endpoint and --from-launcher), then the training script and its arguments.
  std::vector<std::string> agent_args;
  std::vector<std::string> command;
  std::map<std::string, std::string> exports;
  std::vector<std::string> export_sources;  // "NAME (from where)", for the log
  std::string working_dir;
  // muster on the hosts: MUSTER_REMOTE_PATH, else this binary's path; muster on
  // the host's PATH where that is not there.
  std::string muster_path;
  std::vector<std::string> ssh = {"ssh"};  // the ssh command's argv prefix
  int fanout = kDefaultFanout;
};

// What the launching host knows of itself.
struct FanoutFacts {
  HostFacts host;
  std::string working_dir;
  std::string muster_path;
  std::string home;  // "" : none
  // Reads a file's text (the .muster_env files); nullopt when it is absent.
  std::function<std::optional<std::string>(const std::string&)> read_file;
};

// Whether the command line asks for a launch over ssh.
bool wants_fanout(const ParsedArgs& args);

Result<FanoutConfig> resolve_fanout(const ParsedArgs& args, const Environment& env, const FanoutFacts& facts);

// Parses a .muster_env file's text: NAME=VALUE lines, # comments, blank lines.
Result<std::map<std::string, std::string>> parse_env_file(const std::string& text, const std::string& path);

}  // namespace muster::launcher

namespace muster::launcher {

// What ssh runs on `host`: a POSIX shell snippet (for the user's login shell)
// that enters the working directory, finds muster (this binary's path, else
// muster on PATH) and runs it with `agent_args`, saying which of the two is
// missing with kExitNoDirectory or kExitNoMuster.
constexpr int kExitNoDirectory = 200;
constexpr int kExitNoMuster = 201;
std::string remote_command(const FanoutConfig& fc, const std::vector<std::string>& agent_args);
// The whole argv of one host's ssh: the ssh command, batch mode without a
// terminal, keep-alives, the host, the remote command.
std::vector<std::string> ssh_argv(const FanoutConfig& fc, const RemoteHost& host, const std::string& command);
// Quotes a word for a POSIX shell.
std::string shell_quote(const std::string& word);

}  // namespace muster::launcher
