// What `muster --metrics-listen` serves: the agent's state as Prometheus text.
// The driver fills an AgentMetrics snapshot at each scrape; rendering is pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace muster::launcher {

struct AgentMetrics {
  std::string phase;  // idle, running, stopping, waiting, finished
  int local_world_size = 0;
  int workers_running = 0;
  int restarts = 0;  // restarts of the worker group so far (TORCHELASTIC_RESTART_COUNT of the workers)
  int max_restarts = 0;
  uint64_t worker_group_starts = 0;
  uint64_t worker_failures = 0;  // workers that ended badly on their own (not stopped by the agent)
  uint64_t log_lines_dropped = 0;
  struct Exit {
    int local_rank = 0;
    int rank = 0;      // the global rank it had
    int exitcode = 0;  // torch's convention: -N for death by signal N
  };
  std::vector<Exit> last_exits;  // one per local rank that has exited, by local rank
  // Multi-node jobs: what the rendezvous assigned (absent before the first assignment).
  bool coordinated = false;
  bool rendezvous_connected = false;
  bool assigned = false;
  int round = 0;
  int group_rank = 0;
  int group_world_size = 0;
  int world_size = 0;
};

std::string render_agent_metrics(const AgentMetrics& m, const std::string& version, const std::string& revision);

}  // namespace muster::launcher
