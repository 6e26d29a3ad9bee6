// The channel between a launching command (muster --hostfile) and an agent it
// started over ssh: the agent's standard input, one line a record (pure).
//
// Contract. The launcher writes one header line first, a JSON object:
//   {"channel": 1, "version": V, "order": I, "heartbeat_ms": H,
//    "rdzv_endpoint": E, "key": K, "env": {NAME: VALUE, ...}}
// version: the launcher's muster version, which the agent must match; order:
// the host's place in the host file (its node rank when the job forms);
// rdzv_endpoint: "host:port", or ":port" for "the address this ssh
// connection came from" (SSH_CONNECTION); key: the rendezvous's key in hex,
// absent when the launcher does not host the rendezvous; env: the variables
// the agent and its workers get. Then, one a line: "h" (a heartbeat, every
// heartbeat_ms) and "stop SIGNAME" (end the job as that signal would). End of
// input, or no line for kSilentBeats heartbeat intervals, means the launcher
// is gone. The
// agent answers on its standard output, once, with the line kReadyLine
// followed by its version, before anything else it writes there.
// Everything the agent reads is checked: sizes, names, types.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "muster/common/status.hpp"

namespace muster::launcher::channel {

constexpr int kChannelVersion = 1;
constexpr std::size_t kMaxHeaderBytes = 1024 * 1024;
constexpr std::size_t kMaxRecordBytes = 256;
constexpr std::size_t kMaxEnvEntries = 4096;
constexpr std::chrono::milliseconds kHeartbeat{1000};
// No record for this many heartbeat intervals (10 s by default): the
// launcher, or the network to it, is gone.
constexpr int kSilentBeats = 10;
// How long an agent waits for the header once started.
constexpr std::chrono::milliseconds kHeaderWait{30000};
// The agent's first line on its standard output.
constexpr std::string_view kReadyLine = "@muster-ready ";

struct Header {
  std::string version;
  int order = 0;
  int heartbeat_ms = static_cast<int>(kHeartbeat.count());
  std::string rdzv_endpoint;  // "host:port", or ":port": the ssh client's address
  std::optional<std::string> key_hex;
  std::map<std::string, std::string> env;
};

std::string encode_header(const Header& h);  // with its newline
Result<Header> decode_header(std::string_view line);

namespace record {
struct Heartbeat {};
struct Stop {
  int signo = 0;
};
}  // namespace record
using Record = std::variant<record::Heartbeat, record::Stop>;

std::string encode(const Record& r);  // with its newline
Result<Record> decode_record(std::string_view line);

// ":port" made whole with the first field of SSH_CONNECTION ("client port
// server port"), bracketed when IPv6; an endpoint with a host as it is.
Result<std::string> resolve_endpoint(const std::string& endpoint, const std::string& ssh_connection);

// Whether a name may be set in a worker's environment: [A-Za-z_][A-Za-z0-9_]*.
bool valid_env_name(std::string_view name);

}  // namespace muster::launcher::channel
