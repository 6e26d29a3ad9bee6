// torchrun's command line, parsed the way its argparse parser parses it:
// both spellings of every multi-word option, unique-prefix abbreviations,
// PET_<DEST> environment defaults, the script and everything after it passed
// through untouched. resolve_config then applies torchrun's config_from_args.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch_config.hpp"
#include "muster/common/status.hpp"

namespace muster::launcher {

using Environment = std::map<std::string, std::string>;

struct ParsedArgs {
  // Values by argparse dest (e.g. "nproc_per_node"), from the command line or
  // a PET_ default; options left at a None default are absent.
  std::map<std::string, std::string> values;
  // Options given on the command line (a PET_ default does not count).
  std::map<std::string, bool> given;
  std::map<std::string, bool> flags;
  std::string training_script;
  std::vector<std::string> training_script_args;
  bool help = false;
  bool version = false;
};

// argv without the program name. Errors are the text after "muster: error: ".
Result<ParsedArgs> parse_args(const std::vector<std::string>& argv, const Environment& env);

// What the machine offers, so resolution stays testable without one.
struct HostFacts {
  int cpu_count = 1;
  std::function<Result<int>()> gpu_count;
  std::function<std::string()> new_run_id;
  // The interpreter of the Python environment (venv or conda) the agent's own
  // binary lives in, as pip installs it from the wheel; "" when it lives in none.
  std::string environment_python;
};

// --worker-timeout's seconds: 0 (off), or from kMinWorkerTimeout up to 30
// days; nullopt for anything else (negative, not a number, too small).
constexpr double kMaxWorkerTimeoutSeconds = 30.0 * 24 * 3600;
std::optional<std::chrono::milliseconds> parse_worker_timeout(std::string_view text);

Result<LaunchConfig> resolve_config(const ParsedArgs& args, const Environment& env,
                                    const HostFacts& host);

// The option table as documentation (for the man page): the same source as
// parse_args and help_text.
struct OptionDoc {
  std::vector<std::string> names;
  std::string metavar;  // empty for a flag
  std::vector<std::string> choices;
  std::optional<std::string> default_value;
  bool pet = false;  // reads PET_<DEST>
  std::string dest;
  std::string help;
};
std::vector<OptionDoc> option_docs();

std::string usage_text(const std::string& prog);
std::string help_text(const std::string& prog);

}  // namespace muster::launcher
