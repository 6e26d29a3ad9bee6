// The rendezvous wire format: frames of a 4-byte big-endian length and that
// many bytes of JSON; every message has "type" and protocol version "v".
// docs/protocol.md is the reference for every message and every limit.
//
// Everything that arrives is hostile until decoded: each message has a struct,
// an encoder and a validating decoder that returns a Status naming the field
// for a missing field, a wrong type, a value out of range or one that does
// not fit its type. No decoder throws and none fills in a silent default.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muster/common/status.hpp"
#include "muster/rendezvous/core.hpp"

namespace muster::rendezvous {

constexpr int kProtocolVersion = 1;

// Limits on what a peer may send; crossing one gets an `error` frame and the
// connection closes (docs/protocol.md, "Limits").
constexpr std::size_t kMaxFrame = 1024 * 1024;        // bytes of JSON in one frame
constexpr int kMaxJsonDepth = 16;                     // nesting of arrays and objects
constexpr std::size_t kMaxNameLength = 1024;          // job id, node name, address, role
constexpr std::size_t kMaxTextLength = 64 * 1024;     // messages and reasons
constexpr int kMaxLocalWorldSize = 4096;              // workers on one node
constexpr int kMaxNodes = 500000;                     // max_nodes; with the above, WORLD_SIZE fits an int
constexpr long long kMaxTimeoutMs = 365LL * 24 * 3600 * 1000;  // any timeout or interval: a year
constexpr int kMaxKeepAliveAttempts = 1000000;

std::string encode_frame(const nlohmann::json& message);
// A message's JSON text (bytes that are not UTF-8 replaced, never a throw).
std::string dump_message(const nlohmann::json& message);
// A frame around payload bytes (encode_frame is frame_of(dump_message(m))).
std::string frame_of(std::string_view payload);

// Accumulates bytes and hands out whole frames.
class FrameReader {
 public:
  void feed(std::string_view bytes) { buffer_.append(bytes); }
  // A frame's payload; nullopt when incomplete; a Status when the stream is
  // broken (oversized frame).
  Result<std::optional<std::string>> next();
  std::size_t buffered() const { return buffer_.size() - offset_; }

 private:
  std::string buffer_;
  std::size_t offset_ = 0;
};

// Parses a frame's payload; checks nesting (before parsing), "type" (a
// string) and "v" (exactly this version).
Result<nlohmann::json> parse_message(std::string_view payload);
// The deepest nesting of arrays and objects in a JSON text, counted without
// parsing; stops counting past `limit`.
int json_depth(std::string_view text, int limit);

// --- Agent -> server --------------------------------------------------------

// What an agent asks for when it joins a job.
struct JoinMessage {
  std::string job;
  JoinRequest request;
  Settings settings;
};
struct WorkersFailedMessage {
  int round = 0;
  FailureInfo failure;
};
struct WorkersSucceededMessage {
  int round = 0;
};

// A worker of this member was taken for hung (sent only to a server whose
// assignment listed kFeatureStacks): the others take their stacks.
struct HungMessage {
  int round = 0;
  int global_rank = 0;
};
nlohmann::json to_json(const HungMessage& m);
Result<HungMessage> hung_from_json(const nlohmann::json& j);

nlohmann::json to_json(const JoinMessage& m);
nlohmann::json to_json(const WorkersFailedMessage& m);
nlohmann::json to_json(const WorkersSucceededMessage& m);
// A heartbeat with a seq is acknowledged (heartbeat_ack with that seq); one
// with progress, from a member waiting for a round, is answered with `waiting`.
struct HeartbeatMessage {
  std::optional<uint64_t> seq;
  bool progress = false;
};
nlohmann::json heartbeat_message(const HeartbeatMessage& m = {});
Result<HeartbeatMessage> heartbeat_from_json(const nlohmann::json& j);
nlohmann::json heartbeat_ack_message(uint64_t seq);
nlohmann::json leave_message();
Result<JoinMessage> join_from_json(const nlohmann::json& j);
Result<WorkersFailedMessage> workers_failed_from_json(const nlohmann::json& j);
Result<WorkersSucceededMessage> workers_succeeded_from_json(const nlohmann::json& j);

nlohmann::json to_json(const FailureInfo& f);
Result<FailureInfo> failure_from_json(const nlohmann::json& j);

// --- Authentication (auth.hpp), each in a frame of its own, untagged -------

// Agent -> server, the connection's first message when the agent has a key.
struct HelloMessage {
  std::string nonce;  // auth::kNonceBytes raw bytes (hex on the wire)
};
// Server -> agent: its nonce and its proof of the key.
struct ChallengeMessage {
  std::string nonce;
  std::string proof;
  // While a key is being rotated: the proof under the key it replaces.
  std::optional<std::string> previous_proof;
};
// Agent -> server: its proof of the key; every frame after it is tagged.
struct AuthMessage {
  std::string proof;
};
nlohmann::json to_json(const HelloMessage& m);
nlohmann::json to_json(const ChallengeMessage& m);
nlohmann::json to_json(const AuthMessage& m);
Result<HelloMessage> hello_from_json(const nlohmann::json& j);
Result<ChallengeMessage> challenge_from_json(const nlohmann::json& j);
Result<AuthMessage> auth_from_json(const nlohmann::json& j);

// --- Operator queries (musterctl), on a connection that need not join -------

// Replies are cut to about kQueryReplyBytes of JSON and say where to go on.
constexpr std::size_t kQueryReplyBytes = 512 * 1024;

// "jobs": every job the server holds, open and recently finished, by id,
// starting after `after`.
struct JobsQuery {
  std::string after;
};
// "job": one job and its members, from member `from` (by group rank, then name).
struct JobQuery {
  std::string job;
  int from = 0;
};
struct JobSummary {
  std::string id;
  std::string state;  // forming, running, closed; succeeded, failed once finished
  int nodes = 0;      // members connected to the job (joined or waiting)
  int in_round = 0;   // of those, in the current round
  int min_nodes = 0;
  int max_nodes = 0;
  int round = 0;
  int restarts = 0;
  int max_restarts = 0;
  long long age_ms = 0;
};
struct JobsReply {
  std::vector<JobSummary> jobs;
  std::optional<std::string> next_after;  // more after this id
};
struct MemberSummary {
  std::string node;
  std::string address;
  std::string role;
  int local_world_size = 0;
  std::optional<int> group_rank;
  bool in_round = false;
  bool waiting = false;
  bool connected = true;
  long long heard_ms_ago = 0;
  std::optional<long long> parked_ms;  // excluded: joined, taken in after this long
};
// A node excluded from the job, by address.
struct ExclusionSummary {
  std::string address;
  std::string node;
  std::string why;
  int count = 0;
  long long left_ms = 0;  // of its cooldown (0: over)
};
// A node whose health check fails (it reported so with `health`).
struct UnhealthySummary {
  std::string node;
  std::string address;
  std::string role;
  int failures = 0;
  std::string detail;         // how the check failed, and the end of its output
  long long reported_ms_ago = 0;
  long long retry_in_ms = 0;  // when the node said it would try again (0: at once)
};
// A job's state in a `job` reply when no node has joined it but some report
// a failing health check.
constexpr const char* kNotJoinedState = "not_joined";
struct JobReply {
  JobSummary job;
  int total_members = 0;
  std::vector<MemberSummary> members;
  std::optional<int> next_from;
  std::optional<FailureInfo> last_failure;
  std::string last_failure_node;
  long long last_failure_ms_ago = 0;
  std::vector<ExclusionSummary> exclusions;
  std::vector<UnhealthySummary> unhealthy;
};
// "health": an agent whose health check failed says so, on a connection of
// its own that never joins (as a query), so `musterctl job` shows nodes that
// stay out of the job. The server answers `health_noted`; an older one,
// `error` (a message other than join before the join).
constexpr std::size_t kMaxHealthDetail = 1024;  // bytes of `detail`
constexpr std::size_t kMaxUnhealthyPerJob = 256;  // failing nodes a server keeps (and a job reply lists) per job
struct HealthReport {
  std::string job;
  std::string node;     // the agent's identity, as in its joins
  std::string address;
  std::string role = "default";
  int failures = 1;     // the node's failed checks so far
  std::string detail;   // how it failed, and the end of its output (at most kMaxHealthDetail)
  long long retry_in_ms = 0;  // when it tries again (0: at once, or not on its own)
  long long check_timeout_ms = 0;  // how long that run may take (--health-check-timeout; optional)
};
nlohmann::json to_json(const HealthReport& r);
nlohmann::json to_json(const UnhealthySummary& u);
Result<HealthReport> health_report_from_json(const nlohmann::json& j);
nlohmann::json health_noted_message();
// "stacks": every agent of the job's running round that can takes its
// workers' Python stacks into its log; the reply says how many were asked.
struct StacksQuery {
  std::string job;
};
struct StacksReply {
  std::string state;  // the job's state (forming, running, closed)
  int asked = 0;      // agents told to take their workers' stacks
  int unable = 0;     // agents of the round too old to be asked
};
nlohmann::json to_json(const StacksQuery& q);
Result<StacksQuery> stacks_query_from_json(const nlohmann::json& j);
nlohmann::json to_json(const StacksReply& r);
Result<StacksReply> stacks_reply_from_json(const nlohmann::json& j);

nlohmann::json to_json(const JobsQuery& q);
nlohmann::json to_json(const JobQuery& q);
Result<JobsQuery> jobs_query_from_json(const nlohmann::json& j);
Result<JobQuery> job_query_from_json(const nlohmann::json& j);
nlohmann::json to_json(const JobSummary& s);
nlohmann::json to_json(const MemberSummary& m);
nlohmann::json to_json(const JobsReply& r);
nlohmann::json to_json(const JobReply& r);
Result<JobsReply> jobs_reply_from_json(const nlohmann::json& j);
Result<JobReply> job_reply_from_json(const nlohmann::json& j);

// --- Server -> agent --------------------------------------------------------

// The server's messages to a member (the member field is not sent).
nlohmann::json to_json(const Output& o);
nlohmann::json error_message(Code code, const std::string& message);
// The `error` message, decoded.
struct ErrorMessage {
  std::string code;
  std::string message;
};
// Any message the server sends, decoded and checked (member left 0).
struct HeartbeatAck {
  uint64_t seq = 0;
};
using ServerMessage = std::variant<out::Assign, out::Restart, out::Reject, out::Finished, ErrorMessage, out::Fenced,
                                   out::Resumed, out::Waiting, HeartbeatAck, out::DumpStacks>;
Result<ServerMessage> server_message_from_json(const nlohmann::json& j);
// What an `error` frame says: its message, or the frame itself when it does
// not decode as one.
std::string error_text(const nlohmann::json& j);

}  // namespace muster::rendezvous
