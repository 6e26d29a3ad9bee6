// Inside a Slurm step: what srun tells each task about the step, read from
// its SLURM_* variables, so `srun -N2 muster --nproc-per-node=4 train.py` forms
// one job over the step's nodes (docs/slurm.md). Pure: the environment in,
// the step or an error out.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher {

// Hosts one hostlist may expand to: a step of more nodes than this is refused
// (Slurm's own limit on a step is far below it).
constexpr std::size_t kMaxHostlistHosts = 1 << 20;

// Slurm's hostlist syntax, as `scontrol show hostnames` expands it:
// "n[1-3,07],gpu-a[01-02]b" -> n1 n2 n3 n07 gpu-a01b gpu-a02b; a range keeps
// the width of its first bound's digits ("01-10" -> 01 .. 10); several
// bracket groups in one name multiply out, left to right.
Result<std::vector<std::string>> expand_hostlist(std::string_view list, std::size_t max_hosts = kMaxHostlistHosts);

struct SlurmStep {
  std::string job_id;
  std::string step_id;
  int nodes = 0;        // SLURM_STEP_NUM_NODES
  int node_id = 0;      // SLURM_NODEID: this node's index in the step
  int tasks = 0;        // SLURM_STEP_NUM_TASKS (0: not set)
  std::string head;     // the step's first host (SLURM_STEP_NODELIST)
  std::optional<int> gpus_on_node;  // SLURM_GPUS_ON_NODE
  int port = 0;         // slurm_port(job_id, step_id)
};

// nullopt outside a Slurm step (no SLURM_JOB_ID or no SLURM_STEP_NUM_NODES, as
// in an sbatch script's own shell); an error for a step whose variables do not
// make sense (named, with what to do).
Result<std::optional<SlurmStep>> read_slurm_step(const std::map<std::string, std::string>& env);

// The port of a step's rendezvous and store on its head node: 20000 plus
// (job id * 16 + step id mod 16) mod 12768, so 20000..32767, below Linux's
// ephemeral ports. The steps of one job that share a head node get different
// ports (up to 16 at once), as do jobs whose ids are less than 798 apart.
// --master-port overrides it.
int slurm_port(const std::string& job_id, const std::string& step_id);

}  // namespace muster::launcher
