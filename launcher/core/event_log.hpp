// torchrun's --event-log-handler: the agent's events as torch's
// SimpleElasticAgent records them (torch.distributed.elastic.events), one JSON
// object per line, written the way Python's json.dumps writes it (", " and
// ": ", insertion order, ASCII-escaped). "console" prints them on stderr;
// "null" and "dynamic_rendezvous" (a NullHandler for these events in torch)
// print nothing. Formatting is pure; the driver says when.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace muster::launcher {

// json.dumps(value) with Python's default separators.
std::string python_json(const nlohmann::ordered_json& value);

struct EventJob {
  std::string run_id;
  std::string role;
  std::string hostname;
  std::string rdzv_backend;
  std::string entry_point;  // torch: os.path.basename(executable), or the function's name
};

struct EventGroup {
  std::optional<int> group_rank;        // null before the first rendezvous completes
  std::optional<int> group_world_size;  // likewise
  int agent_restarts = 0;               // max_restarts - remaining restarts
  long long total_run_time = 0;         // whole seconds, known once the run is over
};

struct EventWorker {
  int global_rank = 0;
  int local_rank = 0;
  int role_rank = 0;
  int role_world_size = 0;
  std::string worker_id;            // the worker's pid, as torch's subprocess id
  std::optional<int> exit_code;     // failures only
  std::optional<int> worker_pid;    // failures only
};

// source: "AGENT" or "WORKER"; state: RENDEZVOUS, START, SUCCEEDED, ...
// raw_error: a JSON text or a message (null when absent); duration_ms: for
// the timed agent steps.
std::string format_event(const std::string& state, const std::string& source, const EventJob& job,
                         const EventGroup& group, const EventWorker* worker,
                         const std::optional<std::string>& raw_error, const std::optional<double>& duration_ms);

// The raw_error of a failed worker, as torch's ProcessFailure keeps it: the
// error file's JSON (re-serialized), or {"message": "<NONE>"} without one, with
// torch's errorTraits when the worker exited with a code (not a signal).
// torch adds those traits to one shared dictionary, so once a failure has
// added them every later file-less failure of the agent carries them too:
// traits_added tracks that.
std::string failure_raw_error(const std::string& error_file, int exit_code, bool& traits_added);

}  // namespace muster::launcher
