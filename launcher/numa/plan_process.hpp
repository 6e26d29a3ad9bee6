// --numa-binding's plan, worked out in a short-lived child process: the CUDA
// driver (cuInit) and hwloc's plugins never load into the agent, whose later
// fork() of each worker's shim must run no library's fork handlers (libcuda
// registers some). The child is forked while the agent is still one thread
// (main, before the event loop), so it may allocate and load freely.
//
// Contract: plan_in_child(planner, limit) runs planner() in a child, which
// sends the bindings (or the error) back through a pipe and exits; the agent
// waits at most `limit` for the answer (then kills the child) and reaps it.
// The child dies with the agent (PR_SET_PDEATHSIG). A child that dies without
// an answer is an error that says how it ended.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "numa_binding.hpp"

namespace muster::launcher::numa {

using Planner = std::function<Result<std::vector<Binding>>()>;

// How long the GPU and topology query may take: cuInit alone can take
// seconds on a large node without the NVIDIA persistence daemon.
constexpr std::chrono::seconds kPlanLimit{120};

Result<std::vector<Binding>> plan_in_child(const Planner& planner, std::chrono::milliseconds limit = kPlanLimit);

// The plan for this machine: the CUDA driver's GPUs (cuda_devices.hpp), its
// topology (open_topology, sysfs alone should hwloc fail) and this process's
// affinity. cuda_visible_devices: the agent's CUDA_VISIBLE_DEVICES, for the
// message when no GPU shows. Meant for plan_in_child: it loads the driver.
Result<std::vector<Binding>> plan_on_this_machine(Mode mode, int nproc,
                                                  const std::optional<std::string>& cuda_visible_devices);

// The child's answer on the pipe, one line a binding or one error line
// (exposed for the unit tests).
std::string encode_plan(const Result<std::vector<Binding>>& plan);
Result<std::vector<Binding>> decode_plan(const std::string& text);

}  // namespace muster::launcher::numa
