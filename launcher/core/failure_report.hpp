// torchrun's failure report (its ChildFailedError message): the failing
// workers, the root cause (first observed failure) last, each with rank,
// host, exit code or signal, and the traceback from its error file.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher {

// What a worker's TORCHELASTIC_ERROR_FILE said.
struct ErrorFileContent {
  std::string raw_json;
  bool message_is_object = false;
  std::string traceback;  // py_callstack, else message.message, else "<N/A>"; or the string message
  long long timestamp = 0;
};

// The file must exist; a parse error names the file.
Result<ErrorFileContent> read_error_file(const std::string& path);

struct ProcessFailure {
  int global_rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  int exitcode = 0;               // negative: killed by that signal
  std::string error_file;         // "<N/A>" when the worker wrote none
  std::string message;            // traceback text as it appears in the report
  bool message_is_object = false; // object messages get "\n  " continuation
  long long timestamp = 0;        // unix seconds
  bool stopped_by_agent = false;  // a peer the agent stopped because of the failure
  std::string host;               // the node it ran on, when not the reporting one
};

// Builds the failure of a worker from its exit and its error file (if any).
ProcessFailure make_process_failure(int global_rank, int local_rank, pid_t pid, int exitcode,
                                    const std::string& error_file_path, long long now_unix,
                                    bool stopped_by_agent);

// The index into failures of the root cause: the earliest timestamp among the
// workers that failed by themselves, ties to the first observed.
std::size_t root_cause_index(const std::vector<ProcessFailure>& failures);

// The report text, starting with a newline, as torchrun prints it after
// "ChildFailedError: ". host is the launcher's FQDN.
std::string format_failure_report(const std::string& entrypoint_name, const std::vector<ProcessFailure>& failures,
                                  const std::string& host);

// Python's socket.getfqdn() of this machine.
std::string local_fqdn();

}  // namespace muster::launcher
