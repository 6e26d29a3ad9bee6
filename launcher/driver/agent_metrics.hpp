// What `muster --metrics-listen` serves: the agent's state as Prometheus text.
// The driver fills an AgentMetrics snapshot at each scrape; rendering is pure.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace muster::launcher {

struct AgentMetrics {
  std::string phase;  // idle, running, stopping, waiting, finished
  int local_world_size = 0;
  int workers_running = 0;
  int restart_count = 0;  // the workers' TORCHELASTIC_RESTART_COUNT (a multi-node job's, from the rendezvous)
  int max_restarts = 0;
  uint64_t worker_group_starts = 0;
  uint64_t worker_failures = 0;  // workers that ended badly on their own (not stopped by the agent)
  uint64_t log_lines_dropped = 0;
  // --health-check: configured, the last run passed (or none ran yet), failed runs.
  bool health_check = false;
  bool healthy = true;
  uint64_t health_check_failures = 0;
  struct Exit {
    int local_rank = 0;
    int exitcode = 0;  // torch's convention: -N for death by signal N
  };
  std::vector<Exit> last_exits;  // one per local rank that has exited, by local rank
  // Multi-node jobs: the assignment the workers run under (none while the
  // node waits for a round, before the first and between re-forms).
  bool coordinated = false;
  bool rendezvous_connected = false;
  bool assigned = false;
  int round = 0;
  int group_rank = 0;
  int group_world_size = 0;
  int world_size = 0;
};

// What the driver counts over the agent's life for the metrics, beside what
// its parts know (the core's phase and starts, the supervisor's workers, the
// console's dropped lines, the member's round).
struct AgentCounters {
  uint64_t worker_failures = 0;
  std::map<int, int> last_exitcodes;  // by local rank: torch's exitcode of its latest worker

  void failed() { ++worker_failures; }
  void exited(int local_rank, int exitcode) { last_exitcodes[local_rank] = exitcode; }
};

std::string render_agent_metrics(const AgentMetrics& m, const std::string& version, const std::string& revision);

}  // namespace muster::launcher
