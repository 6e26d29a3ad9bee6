#include "agent_metrics.hpp"

#include "muster/metrics/http.hpp"

namespace muster::launcher {

std::string render_agent_metrics(const AgentMetrics& m, const std::string& version, const std::string& revision) {
  metrics::Text t;
  t.family("muster_agent_phase", "gauge", "The agent's life-cycle phase: 1 for the current one.");
  for (const char* phase : {"idle", "running", "stopping", "waiting", "finished"}) {
    t.sample({{"phase", phase}}, m.phase == phase ? 1 : 0);
  }
  t.family("muster_local_world_size", "gauge", "Workers this agent runs per attempt (--nproc-per-node).");
  t.sample(m.local_world_size);
  t.family("muster_workers_running", "gauge", "Workers alive now.");
  t.sample(m.workers_running);
  t.family("muster_restart_count", "gauge",
           "The workers' TORCHELASTIC_RESTART_COUNT: restarts of the group so far (the job's, in a multi-node job).");
  t.sample(m.restart_count);
  t.family("muster_max_restarts", "gauge", "Restarts allowed (--max-restarts).");
  t.sample(m.max_restarts);
  t.family("muster_worker_group_starts_total", "counter", "Times this agent started its worker group.");
  t.sample(static_cast<double>(m.worker_group_starts));
  t.family("muster_worker_failures_total", "counter",
           "Workers that exited non-zero or by a signal on their own (not stopped by the agent).");
  t.sample(static_cast<double>(m.worker_failures));
  t.family("muster_worker_last_exit_code", "gauge",
           "How each local rank's latest worker ended: its exit code, or -N for death by signal N.");
  for (const auto& e : m.last_exits) {
    t.sample({{"local_rank", std::to_string(e.local_rank)}}, e.exitcode);
  }
  t.family("muster_log_lines_dropped_total", "counter", "Agent log lines dropped while stderr was not being read.");
  t.sample(static_cast<double>(m.log_lines_dropped));
  if (m.health_check) {
    t.family("muster_health_check_healthy", "gauge",
             "1 while the node's --health-check passed its last run (or none ran yet), 0 while it fails.");
    t.sample(m.healthy ? 1 : 0);
    t.family("muster_health_check_failures_total", "counter", "Runs of the node's --health-check that failed.");
    t.sample(static_cast<double>(m.health_check_failures));
  }
  if (m.coordinated) {
    t.family("muster_rendezvous_connected", "gauge", "1 while the connection to the rendezvous is up.");
    t.sample(m.rendezvous_connected ? 1 : 0);
    if (m.assigned) {
      t.family("muster_rendezvous_round", "gauge", "The rendezvous round the workers run in.");
      t.sample(m.round);
      t.family("muster_group_rank", "gauge", "This node's group rank (GROUP_RANK).");
      t.sample(m.group_rank);
      t.family("muster_group_world_size", "gauge", "Nodes in the job (GROUP_WORLD_SIZE).");
      t.sample(m.group_world_size);
      t.family("muster_world_size", "gauge", "Workers in the job (WORLD_SIZE).");
      t.sample(m.world_size);
    }
  }
  t.family("muster_build_info", "gauge", "The running muster's version.");
  t.sample({{"version", version}, {"revision", revision}}, 1);
  return t.str();
}

}  // namespace muster::launcher
