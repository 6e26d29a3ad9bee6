// torchrun's config_from_args: what a parsed command line means, as a
// LaunchConfig (the job's shape, the rendezvous, the workers' output, the
// agent's bounds, the worker command), with torchrun's defaults, rewrites,
// warnings and errors, and Slurm's step inferred where nothing says how nodes meet.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "argparse.hpp"
#include "launch_config.hpp"

namespace muster::launcher {

// What the machine offers, so resolution stays testable without one.
struct HostFacts {
  int cpu_count = 1;
  std::function<Result<int>()> gpu_count;
  std::function<Result<std::string>()> new_run_id;
  // The interpreter of the Python environment (venv or conda) the agent's own
  // binary lives in, as pip installs it from the wheel; "" when it lives in none.
  std::string environment_python;
};

// --worker-timeout's seconds: 0 (off), or from kMinWorkerTimeout up to 30
// days; nullopt for anything else (negative, not a number, too small).
constexpr double kMaxWorkerTimeoutSeconds = 30.0 * 24 * 3600;
std::optional<std::chrono::milliseconds> parse_worker_timeout(std::string_view text);

Result<LaunchConfig> resolve_config(const ParsedArgs& args, const Environment& env, const HostFacts& host);

}  // namespace muster::launcher
