#include "muster/rendezvous/protocol.hpp"

#include <limits>

#include "muster/rendezvous/auth.hpp"
#include "muster/common/text.hpp"

namespace muster::rendezvous {

using nlohmann::json;

std::string dump_message(const json& message) {
  // Text that came from elsewhere (a worker's error file, a host name) may not
  // be UTF-8: replace bad bytes rather than throw.
  return message.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string encode_frame(const json& message) { return frame_of(dump_message(message)); }

std::string frame_of(std::string_view payload) {
  auto n = static_cast<uint32_t>(payload.size());
  std::string out;
  out.reserve(payload.size() + 4);
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>(n & 0xff));
  out += payload;
  return out;
}

namespace {
// Consumed input is dropped once this much has piled up before the unread
// rest, and an emptied buffer larger than this gives its memory back.
constexpr std::size_t kReaderSlack = 64 * 1024;
}  // namespace

Result<std::optional<std::string>> FrameReader::next() {
  if (buffer_.size() - offset_ < 4) return std::optional<std::string>{};
  auto b = [&](std::size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(buffer_[offset_ + i])); };
  uint32_t n = (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
  if (n > kMaxFrame) {
    return invalid_argument("a frame of " + std::to_string(n) + " bytes is over the limit of " +
                            std::to_string(kMaxFrame));
  }
  if (buffer_.size() - offset_ - 4 < n) return std::optional<std::string>{};
  std::string payload = buffer_.substr(offset_ + 4, n);
  offset_ += 4 + n;
  if (offset_ == buffer_.size()) {
    // An idle connection keeps no memory from an earlier large frame.
    if (buffer_.capacity() > kReaderSlack) std::string().swap(buffer_);
    else buffer_.clear();
    offset_ = 0;
  } else if (offset_ > kReaderSlack && offset_ * 2 > buffer_.size()) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  return std::optional<std::string>(std::move(payload));
}

int json_depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

Result<json> parse_message(std::string_view payload) {
  // Checked before parsing: a deep value would make every later copy recurse.
  if (json_depth(payload, kMaxJsonDepth) > kMaxJsonDepth) {
    return invalid_argument("the message nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  json j = json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("the message is not a JSON object");
  auto type = j.find("type");
  if (type == j.end() || !type->is_string()) return invalid_argument("the message has no \"type\"");
  if (type->get_ref<const std::string&>().size() > kMaxNameLength) {
    return invalid_argument("the message's \"type\" is over " + std::to_string(kMaxNameLength) + " bytes");
  }
  auto v = j.find("v");
  if (v == j.end() || !(v->is_number_integer() || v->is_number_unsigned())) {
    return invalid_argument("the message has no protocol \"v\"");
  }
  bool same = v->is_number_unsigned() ? v->get<uint64_t>() == static_cast<uint64_t>(kProtocolVersion)
                                      : v->get<int64_t>() == kProtocolVersion;
  if (!same) {
    return invalid_argument("protocol version " + log_excerpt(v->dump(), 32) + " is not supported (this is " +
                            std::to_string(kProtocolVersion) + "); use agents and daemon of the same release");
  }
  return j;
}

namespace {

// Reads typed fields of one JSON object, remembering the first error; each
// getter reports whether the field was there and valid.
class Fields {
 public:
  Fields(const json& j, std::string what) : j_(j), what_(std::move(what)) {
    if (!j_.is_object()) fail("", "must be an object");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // An integer in [min, max]; floats (1.5, 1e300) and out-of-range values are refused.
  template <typename T>
  bool integer(const char* key, long long min, long long max, T& out, bool required = true) {
    const json* v = find(key, required);
    if (v == nullptr) return false;
    long long value = 0;
    if (v->is_number_integer() && !v->is_number_unsigned()) {
      value = v->get<int64_t>();
    } else if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<long long>::max())) return range(key, min, max, v);
      value = static_cast<long long>(u);
    } else {
      return fail(key, "must be an integer, got " + log_excerpt(v->dump(), 40));
    }
    if (value < min || value > max) return range(key, min, max, v);
    out = static_cast<T>(value);
    return true;
  }

  bool string(const char* key, std::size_t max_length, std::string& out, bool required = true) {
    const json* v = find(key, required);
    if (v == nullptr) return false;
    if (!v->is_string()) return fail(key, "must be a string, got " + log_excerpt(v->dump(), 40));
    const auto& s = v->get_ref<const std::string&>();
    if (s.size() > max_length) {
      return fail(key, "is " + std::to_string(s.size()) + " bytes, over the limit of " + std::to_string(max_length));
    }
    out = s;
    return true;
  }

  bool boolean(const char* key, bool& out, bool required = true) {
    const json* v = find(key, required);
    if (v == nullptr) return false;
    if (!v->is_boolean()) return fail(key, "must be true or false, got " + log_excerpt(v->dump(), 40));
    out = v->get<bool>();
    return true;
  }

  bool duration(const char* key, long long min_ms, Duration& out, bool required = true) {
    long long ms = 0;
    if (!integer(key, min_ms, kMaxTimeoutMs, ms, required)) return false;
    out = Duration(ms);
    return true;
  }

  const json* object(const char* key, bool required = true) {
    const json* v = find(key, required);
    if (v == nullptr) return nullptr;
    if (!v->is_object()) {
      fail(key, "must be an object");
      return nullptr;
    }
    return v;
  }

  bool has(const char* key) const { return j_.is_object() && j_.contains(key); }

  // An optional list of short names (features), read leniently so that a
  // later release's list never breaks this one: an array of strings, of
  // which the first kMaxFeatures of at most kMaxFeatureLength bytes are kept
  // (this release knows only short ones) and the rest ignored.
  bool names(const char* key, std::vector<std::string>& out) {
    const json* v = find(key, false);
    if (v == nullptr) return false;
    if (!v->is_array()) return fail(key, "must be an array of strings");
    std::vector<std::string> got;
    for (const auto& e : *v) {
      if (!e.is_string()) return fail(key, "must be an array of strings");
      const auto& s = e.get_ref<const std::string&>();
      if (s.size() <= kMaxFeatureLength && got.size() < kMaxFeatures) got.push_back(s);
    }
    out = std::move(got);
    return true;
  }

 private:
  const json* find(const char* key, bool required) {
    if (!ok() || !j_.is_object()) return nullptr;
    auto it = j_.find(key);
    if (it == j_.end()) {
      if (required) fail(key, "is missing");
      return nullptr;
    }
    return &*it;
  }
  bool range(const char* key, long long min, long long max, const json* v) {
    return fail(key, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
                         log_excerpt(v->dump(), 40));
  }
  bool fail(const std::string& key, const std::string& why) {
    if (ok()) {
      status_ = invalid_argument(what_ + (key.empty() ? "" : ": \"" + key + "\"") + " " + why);
    }
    return false;
  }

  const json& j_;
  std::string what_;
  Status status_;
};

long long ms(Duration d) { return d.count(); }
constexpr long long kMaxInt = std::numeric_limits<int>::max();
constexpr long long kMinInt = std::numeric_limits<int>::min();

// A Placement's fields, the same in an assign and in a join's resume.
void put_placement(json& x, const Placement& p) {
  x["round"] = p.round;
  x["restart_count"] = p.restart_count;
  x["group_rank"] = p.group_rank;
  x["group_world_size"] = p.group_world_size;
  x["base_global_rank"] = p.ranks.base_global_rank;
  x["global_world_size"] = p.ranks.global_world_size;
  x["base_role_rank"] = p.ranks.base_role_rank;
  x["role_world_size"] = p.ranks.role_world_size;
  x["master_addr"] = p.master_addr;
  x["master_port"] = p.master_port;
}

void get_placement(Fields& f, Placement& p) {
  f.integer("round", 0, kMaxInt, p.round);
  f.integer("restart_count", 0, kMaxInt, p.restart_count);
  f.integer("group_rank", 0, kMaxNodes - 1, p.group_rank);
  f.integer("group_world_size", 1, kMaxNodes, p.group_world_size);
  f.integer("base_global_rank", 0, kMaxInt, p.ranks.base_global_rank);
  f.integer("global_world_size", 1, kMaxInt, p.ranks.global_world_size);
  f.integer("base_role_rank", 0, kMaxInt, p.ranks.base_role_rank);
  f.integer("role_world_size", 1, kMaxInt, p.ranks.role_world_size);
  f.string("master_addr", kMaxNameLength, p.master_addr);
  f.integer("master_port", 0, 65535, p.master_port);
}

// The ranks must lie inside their worlds.
Status check_placement(const Placement& p, const char* what) {
  if (p.group_rank >= p.group_world_size || p.ranks.base_global_rank >= p.ranks.global_world_size) {
    return invalid_argument(std::string(what) + ": the ranks lie outside the world (group_rank " +
                            std::to_string(p.group_rank) + " of " + std::to_string(p.group_world_size) +
                            ", base_global_rank " + std::to_string(p.ranks.base_global_rank) + " of " +
                            std::to_string(p.ranks.global_world_size) + ")");
  }
  return {};
}

}  // namespace

json to_json(const JoinMessage& m) {
  json r = {{"type", "join"},
            {"v", kProtocolVersion},
            {"job", m.job},
            {"node", m.request.node_name},
            {"address", m.request.address},
            {"local_world_size", m.request.local_world_size},
            {"role", m.request.role},
            {"store_port", m.request.store_port},
            {"is_host", m.request.is_host}};
  if (m.request.node_rank) r["node_rank"] = *m.request.node_rank;
  if (m.request.launch_order) r["launch_order"] = *m.request.launch_order;
  if (!m.request.features.empty()) r["features"] = m.request.features;
  if (m.request.known_round > 0) r["known_round"] = m.request.known_round;
  if (m.request.known_restart_count > 0) r["known_restart_count"] = m.request.known_restart_count;
  if (const auto& res = m.request.resume) {
    json x = json::object();
    put_placement(x, *res);
    x["outcome"] = res->outcome == Resume::Outcome::running     ? "running"
                   : res->outcome == Resume::Outcome::succeeded ? "succeeded"
                                                                : "failed";
    if (res->failure) x["failure"] = to_json(*res->failure);
    r["resume"] = std::move(x);
  }
  const auto& s = m.settings;
  r["settings"] = {{"min_nodes", s.min_nodes},
                   {"max_nodes", s.max_nodes},
                   {"max_restarts", s.max_restarts},
                   {"join_timeout_ms", ms(s.join_timeout)},
                   {"last_call_timeout_ms", ms(s.last_call_timeout)},
                   {"close_timeout_ms", ms(s.close_timeout)},
                   {"keep_alive_interval_ms", ms(s.keep_alive_interval)},
                   {"keep_alive_max_attempt", s.keep_alive_max_attempt},
                   {"static", s.static_ranks}};
  // New settings go out only when set: an older server never sees them.
  if (s.exclude_after > 0 || s.exclude_cooldown != Settings{}.exclude_cooldown) {
    r["settings"]["exclude_after"] = s.exclude_after;
    r["settings"]["exclude_cooldown_ms"] = ms(s.exclude_cooldown);
  }
  return r;
}

Result<JoinMessage> join_from_json(const json& j) {
  JoinMessage m;
  Fields f(j, "join");
  f.string("job", kMaxNameLength, m.job);
  f.string("node", kMaxNameLength, m.request.node_name);
  f.string("address", kMaxNameLength, m.request.address);
  f.integer("local_world_size", 1, kMaxLocalWorldSize, m.request.local_world_size);
  f.string("role", kMaxNameLength, m.request.role, false);
  f.integer("store_port", 0, 65535, m.request.store_port);
  f.boolean("is_host", m.request.is_host, false);
  int node_rank = 0;
  if (f.integer("node_rank", 0, kMaxNodes - 1, node_rank, false)) m.request.node_rank = node_rank;
  int launch_order = 0;
  if (f.integer("launch_order", 0, kMaxNodes - 1, launch_order, false)) m.request.launch_order = launch_order;
  f.names("features", m.request.features);
  f.integer("known_round", 0, kMaxInt, m.request.known_round, false);
  f.integer("known_restart_count", 0, kMaxInt, m.request.known_restart_count, false);
  const json* resume = f.object("resume", false);
  const json* settings = f.object("settings");
  if (!f.ok()) return f.status();
  if (resume != nullptr) {
    Resume r;
    std::string outcome;
    Fields g(*resume, "join resume");
    get_placement(g, r);
    g.string("outcome", kMaxNameLength, outcome);
    const json* failure = g.object("failure", false);
    if (!g.ok()) return g.status();
    if (outcome == "running") r.outcome = Resume::Outcome::running;
    else if (outcome == "succeeded") r.outcome = Resume::Outcome::succeeded;
    else if (outcome == "failed") r.outcome = Resume::Outcome::failed;
    else return invalid_argument("join resume: \"outcome\" must be running, succeeded or failed, got '" +
                                 log_excerpt(outcome, 40) + "'");
    if (auto st = check_placement(r, "join resume"); !st.ok()) return st;
    if (r.outcome == Resume::Outcome::failed) {
      if (failure == nullptr) return invalid_argument("join resume: \"failure\" is missing for outcome failed");
      auto decoded = failure_from_json(*failure);
      if (!decoded.ok()) return decoded.status();
      r.failure = std::move(decoded).value();
    }
    m.request.resume = std::move(r);
  }
  if (m.job.empty()) return invalid_argument("a join needs \"job\" (the rdzv_id)");
  if (m.request.node_name.empty()) return invalid_argument("a join needs \"node\", a name for the node");

  Settings& s = m.settings;
  Fields g(*settings, "join settings");
  g.integer("min_nodes", 1, kMaxNodes, s.min_nodes);
  g.integer("max_nodes", 1, kMaxNodes, s.max_nodes);
  g.integer("max_restarts", 0, kMaxInt, s.max_restarts, false);
  g.duration("join_timeout_ms", 1, s.join_timeout, false);
  g.duration("last_call_timeout_ms", 0, s.last_call_timeout, false);
  g.duration("close_timeout_ms", 0, s.close_timeout, false);
  g.duration("keep_alive_interval_ms", 1, s.keep_alive_interval, false);
  g.integer("keep_alive_max_attempt", 1, kMaxKeepAliveAttempts, s.keep_alive_max_attempt, false);
  g.boolean("static", s.static_ranks, false);
  g.integer("exclude_after", 0, kMaxInt, s.exclude_after, false);
  g.duration("exclude_cooldown_ms", 0, s.exclude_cooldown, false);
  if (!g.ok()) return g.status();
  if (s.max_nodes < s.min_nodes) {
    return invalid_argument("min_nodes must be > 0 and <= max_nodes, got min_nodes=" + std::to_string(s.min_nodes) +
                            ", max_nodes=" + std::to_string(s.max_nodes));
  }
  return m;
}

json to_json(const WorkersFailedMessage& m) {
  return {{"type", "workers_failed"}, {"v", kProtocolVersion}, {"round", m.round}, {"failure", to_json(m.failure)}};
}

json to_json(const WorkersSucceededMessage& m) {
  return {{"type", "workers_succeeded"}, {"v", kProtocolVersion}, {"round", m.round}};
}

json heartbeat_message(const HeartbeatMessage& m) {
  json j = {{"type", "heartbeat"}, {"v", kProtocolVersion}};
  if (m.seq) j["seq"] = *m.seq;
  if (m.progress) j["progress"] = true;
  return j;
}

Result<HeartbeatMessage> heartbeat_from_json(const json& j) {
  HeartbeatMessage m;
  long long seq = 0;
  Fields f(j, "heartbeat");
  if (f.integer("seq", 0, std::numeric_limits<long long>::max(), seq, false)) m.seq = static_cast<uint64_t>(seq);
  f.boolean("progress", m.progress, false);
  if (!f.ok()) return f.status();
  return m;
}

json heartbeat_ack_message(uint64_t seq) {
  return {{"type", "heartbeat_ack"}, {"v", kProtocolVersion}, {"seq", seq}};
}

json leave_message() { return {{"type", "leave"}, {"v", kProtocolVersion}}; }

Result<WorkersFailedMessage> workers_failed_from_json(const json& j) {
  WorkersFailedMessage m;
  Fields f(j, "workers_failed");
  f.integer("round", 0, kMaxInt, m.round);
  const json* failure = f.object("failure");
  if (!f.ok()) return f.status();
  auto decoded = failure_from_json(*failure);
  if (!decoded.ok()) return decoded.status();
  m.failure = std::move(decoded).value();
  return m;
}

Result<WorkersSucceededMessage> workers_succeeded_from_json(const json& j) {
  WorkersSucceededMessage m;
  Fields f(j, "workers_succeeded");
  f.integer("round", 0, kMaxInt, m.round);
  if (!f.ok()) return f.status();
  return m;
}

namespace {
// A field of exactly `bytes` raw bytes, sent as hex.
bool hex_field(Fields& f, const char* key, std::size_t bytes, std::string& out) {
  std::string text;
  if (!f.string(key, 2 * bytes + 2, text)) return false;
  auto raw = auth::from_hex(text, bytes);
  if (!raw) return false;
  out = std::move(*raw);
  return true;
}
Status hex_error(const char* what, const char* key, std::size_t bytes) {
  return invalid_argument(std::string(what) + ": \"" + key + "\" must be " + std::to_string(2 * bytes) +
                          " hex digits");
}
}  // namespace

json to_json(const HelloMessage& m) {
  return {{"type", "hello"}, {"v", kProtocolVersion}, {"nonce", auth::to_hex(m.nonce)}};
}
json to_json(const ChallengeMessage& m) {
  json r = {{"type", "challenge"},
            {"v", kProtocolVersion},
            {"nonce", auth::to_hex(m.nonce)},
            {"proof", auth::to_hex(m.proof)}};
  if (m.previous_proof) r["previous_proof"] = auth::to_hex(*m.previous_proof);
  return r;
}
json to_json(const AuthMessage& m) {
  return {{"type", "auth"}, {"v", kProtocolVersion}, {"proof", auth::to_hex(m.proof)}};
}

Result<HelloMessage> hello_from_json(const json& j) {
  HelloMessage m;
  Fields f(j, "hello");
  bool good = hex_field(f, "nonce", auth::kNonceBytes, m.nonce);
  if (!f.ok()) return f.status();
  if (!good) return hex_error("hello", "nonce", auth::kNonceBytes);
  return m;
}

Result<ChallengeMessage> challenge_from_json(const json& j) {
  ChallengeMessage m;
  Fields f(j, "challenge");
  if (!hex_field(f, "nonce", auth::kNonceBytes, m.nonce)) {
    return f.ok() ? hex_error("challenge", "nonce", auth::kNonceBytes) : f.status();
  }
  if (!hex_field(f, "proof", auth::kTagBytes, m.proof)) {
    return f.ok() ? hex_error("challenge", "proof", auth::kTagBytes) : f.status();
  }
  if (f.has("previous_proof")) {
    std::string previous;
    if (!hex_field(f, "previous_proof", auth::kTagBytes, previous)) {
      return f.ok() ? hex_error("challenge", "previous_proof", auth::kTagBytes) : f.status();
    }
    m.previous_proof = std::move(previous);
  }
  return m;
}

Result<AuthMessage> auth_from_json(const json& j) {
  AuthMessage m;
  Fields f(j, "auth");
  if (!hex_field(f, "proof", auth::kTagBytes, m.proof)) {
    return f.ok() ? hex_error("auth", "proof", auth::kTagBytes) : f.status();
  }
  return m;
}

json to_json(const JobsQuery& q) { return {{"type", "jobs"}, {"v", kProtocolVersion}, {"after", q.after}}; }
json to_json(const JobQuery& q) {
  return {{"type", "job"}, {"v", kProtocolVersion}, {"job", q.job}, {"from", q.from}};
}

Result<JobsQuery> jobs_query_from_json(const json& j) {
  JobsQuery q;
  Fields f(j, "jobs");
  f.string("after", kMaxNameLength, q.after, false);
  if (!f.ok()) return f.status();
  return q;
}

Result<JobQuery> job_query_from_json(const json& j) {
  JobQuery q;
  Fields f(j, "job");
  f.string("job", kMaxNameLength, q.job);
  f.integer("from", 0, kMaxInt, q.from, false);
  if (!f.ok()) return f.status();
  return q;
}

json to_json(const JobSummary& s) {
  return {{"id", s.id},         {"state", s.state},       {"nodes", s.nodes},
          {"in_round", s.in_round}, {"min_nodes", s.min_nodes}, {"max_nodes", s.max_nodes},
          {"round", s.round},   {"restarts", s.restarts}, {"max_restarts", s.max_restarts},
          {"age_ms", s.age_ms}};
}

json to_json(const MemberSummary& m) {
  json r = {{"node", m.node},
            {"address", m.address},
            {"role", m.role},
            {"local_world_size", m.local_world_size},
            {"in_round", m.in_round},
            {"waiting", m.waiting},
            {"connected", m.connected},
            {"heard_ms_ago", m.heard_ms_ago}};
  r["group_rank"] = m.group_rank ? json(*m.group_rank) : json(nullptr);
  if (m.parked_ms) r["parked_ms"] = *m.parked_ms;
  return r;
}

json to_json(const JobsReply& r) {
  json jobs = json::array();
  for (const auto& s : r.jobs) jobs.push_back(to_json(s));
  json out = {{"type", "jobs"}, {"v", kProtocolVersion}, {"jobs", std::move(jobs)}};
  if (r.next_after) out["next_after"] = *r.next_after;
  return out;
}

json to_json(const JobReply& r) {
  json members = json::array();
  for (const auto& m : r.members) members.push_back(to_json(m));
  json out = {{"type", "job"},
              {"v", kProtocolVersion},
              {"job", to_json(r.job)},
              {"total_members", r.total_members},
              {"members", std::move(members)}};
  if (r.next_from) out["next_from"] = *r.next_from;
  if (r.last_failure) {
    out["last_failure"] = to_json(*r.last_failure);
    out["last_failure_node"] = r.last_failure_node;
    out["last_failure_ms_ago"] = r.last_failure_ms_ago;
  }
  if (!r.exclusions.empty()) {
    json list = json::array();
    for (const auto& e : r.exclusions) {
      list.push_back({{"address", e.address}, {"node", e.node}, {"why", e.why}, {"count", e.count}, {"left_ms", e.left_ms}});
    }
    out["exclusions"] = std::move(list);
  }
  if (!r.unhealthy.empty()) {
    json list = json::array();
    for (const auto& u : r.unhealthy) list.push_back(to_json(u));
    out["unhealthy"] = std::move(list);
  }
  return out;
}

namespace {
constexpr long long kMaxAgeMs = std::numeric_limits<long long>::max() / 2;

Result<JobSummary> job_summary_from_json(const json& j) {
  JobSummary s;
  Fields f(j, "job");
  f.string("id", kMaxNameLength, s.id);
  f.string("state", kMaxNameLength, s.state);
  f.integer("nodes", 0, kMaxInt, s.nodes);
  f.integer("in_round", 0, kMaxInt, s.in_round);
  f.integer("min_nodes", 0, kMaxNodes, s.min_nodes);
  f.integer("max_nodes", 0, kMaxNodes, s.max_nodes);
  f.integer("round", 0, kMaxInt, s.round);
  f.integer("restarts", 0, kMaxInt, s.restarts);
  f.integer("max_restarts", 0, kMaxInt, s.max_restarts);
  f.integer("age_ms", 0, kMaxAgeMs, s.age_ms);
  if (!f.ok()) return f.status();
  return s;
}
}  // namespace

Result<JobsReply> jobs_reply_from_json(const json& j) {
  JobsReply r;
  Fields f(j, "jobs");
  std::string after;
  if (f.has("next_after") && f.string("next_after", kMaxNameLength, after)) r.next_after = after;
  if (!f.ok()) return f.status();
  auto list = j.find("jobs");
  if (list == j.end() || !list->is_array()) return invalid_argument("jobs: \"jobs\" must be an array");
  for (const auto& e : *list) {
    auto s = job_summary_from_json(e);
    if (!s.ok()) return s.status();
    r.jobs.push_back(std::move(s).value());
  }
  return r;
}

namespace {
// An optional array of a job reply: at most `max` objects, each read by
// `read(fields, element)` (named `what` in errors) into `out`.
template <typename T, typename Read>
Status optional_list(const json& j, const char* key, std::size_t max, const char* what, std::vector<T>& out,
                     Read read) {
  auto list = j.find(key);
  if (list == j.end()) return {};
  if (!list->is_array()) return invalid_argument(std::string("job: \"") + key + "\" must be an array");
  if (list->size() > max) return invalid_argument("job: more than " + std::to_string(max) + " in \"" + key + "\"");
  for (const auto& e : *list) {
    T x;
    Fields g(e, what);
    read(g, x);
    if (!g.ok()) return g.status();
    out.push_back(std::move(x));
  }
  return {};
}
}  // namespace

Result<JobReply> job_reply_from_json(const json& j) {
  JobReply r;
  Fields f(j, "job");
  const json* job = f.object("job");
  f.integer("total_members", 0, kMaxInt, r.total_members);
  int next = 0;
  if (f.has("next_from") && f.integer("next_from", 0, kMaxInt, next)) r.next_from = next;
  const json* failure = f.has("last_failure") ? f.object("last_failure") : nullptr;
  if (failure) {
    f.string("last_failure_node", kMaxNameLength, r.last_failure_node);
    f.integer("last_failure_ms_ago", 0, kMaxAgeMs, r.last_failure_ms_ago);
  }
  if (!f.ok()) return f.status();
  auto s = job_summary_from_json(*job);
  if (!s.ok()) return s.status();
  r.job = std::move(s).value();
  if (failure) {
    auto decoded = failure_from_json(*failure);
    if (!decoded.ok()) return decoded.status();
    r.last_failure = std::move(decoded).value();
  }
  auto list = j.find("members");
  if (list == j.end() || !list->is_array()) return invalid_argument("job: \"members\" must be an array");
  for (const auto& e : *list) {
    MemberSummary m;
    Fields g(e, "member");
    g.string("node", kMaxNameLength, m.node);
    g.string("address", kMaxNameLength, m.address);
    g.string("role", kMaxNameLength, m.role);
    g.integer("local_world_size", 1, kMaxLocalWorldSize, m.local_world_size);
    g.boolean("in_round", m.in_round);
    g.boolean("waiting", m.waiting);
    g.boolean("connected", m.connected);
    g.integer("heard_ms_ago", 0, kMaxAgeMs, m.heard_ms_ago);
    if (g.ok() && e.is_object() && e.contains("group_rank") && !e["group_rank"].is_null()) {
      int rank = 0;
      if (g.integer("group_rank", 0, kMaxNodes, rank)) m.group_rank = rank;
    }
    long long parked = 0;
    if (g.integer("parked_ms", 0, kMaxTimeoutMs, parked, false)) m.parked_ms = parked;
    if (!g.ok()) return g.status();
    r.members.push_back(std::move(m));
  }
  auto exclusions = optional_list(j, "exclusions", kMaxExclusions, "exclusion", r.exclusions,
                                  [](Fields& g, ExclusionSummary& x) {
                                    g.string("address", kMaxNameLength, x.address);
                                    g.string("node", kMaxNameLength, x.node);
                                    g.string("why", kMaxTextLength, x.why);
                                    g.integer("count", 0, kMaxInt, x.count);
                                    g.integer("left_ms", 0, kMaxTimeoutMs, x.left_ms);
                                  });
  if (!exclusions.ok()) return exclusions;
  auto unhealthy = optional_list(j, "unhealthy", kMaxUnhealthyPerJob, "unhealthy node", r.unhealthy,
                                 [](Fields& g, UnhealthySummary& u) {
                                   g.string("node", kMaxNameLength, u.node);
                                   g.string("address", kMaxNameLength, u.address);
                                   g.string("role", kMaxNameLength, u.role);
                                   g.integer("failures", 1, kMaxInt, u.failures);
                                   g.string("detail", kMaxHealthDetail, u.detail);
                                   g.integer("reported_ms_ago", 0, kMaxAgeMs, u.reported_ms_ago);
                                   g.integer("retry_in_ms", 0, kMaxTimeoutMs, u.retry_in_ms);
                                 });
  if (!unhealthy.ok()) return unhealthy;
  return r;
}

json to_json(const FailureInfo& f) {
  json j = {{"global_rank", f.global_rank}, {"local_rank", f.local_rank}, {"exitcode", f.exitcode},
            {"host", f.host},               {"message", f.message},       {"timestamp", f.timestamp}};
  if (f.pid > 0) j["pid"] = f.pid;
  if (f.failed_at_ms > 0) j["failed_at_ms"] = f.failed_at_ms;
  if (f.exclude_node) j["exclude_node"] = true;
  return j;
}

Result<FailureInfo> failure_from_json(const json& j) {
  FailureInfo info;
  Fields f(j, "failure");
  f.integer("global_rank", 0, kMaxInt, info.global_rank);
  f.integer("local_rank", 0, kMaxLocalWorldSize - 1, info.local_rank);
  f.integer("exitcode", kMinInt, kMaxInt, info.exitcode);
  f.string("host", kMaxNameLength, info.host);
  f.integer("pid", 0, kMaxInt, info.pid, false);
  f.string("message", kMaxTextLength, info.message);
  f.integer("timestamp", 0, std::numeric_limits<long long>::max(), info.timestamp);
  f.integer("failed_at_ms", 0, std::numeric_limits<long long>::max(), info.failed_at_ms, false);
  f.boolean("exclude_node", info.exclude_node, false);
  if (!f.ok()) return f.status();
  return info;
}

json to_json(const Output& o) {
  if (const auto* a = std::get_if<out::Assign>(&o)) {
    json x = {{"type", "assign"}, {"v", kProtocolVersion}};
    put_placement(x, *a);
    if (!a->features.empty()) x["features"] = a->features;
    return x;
  }
  if (const auto* d = std::get_if<out::DumpStacks>(&o)) {
    return {{"type", "dump_stacks"}, {"v", kProtocolVersion}, {"reason", d->reason}};
  }
  if (const auto* r = std::get_if<out::Restart>(&o)) {
    return {{"type", "restart"},
            {"v", kProtocolVersion},
            {"next_round", r->next_round},
            {"counts_as_failure", r->counts_as_failure},
            {"reason", r->reason}};
  }
  if (const auto* r = std::get_if<out::Reject>(&o)) {
    return {{"type", "reject"}, {"v", kProtocolVersion}, {"code", code_name(r->code)}, {"message", r->message}};
  }
  if (const auto* f = std::get_if<out::Fenced>(&o)) {
    json x = {{"type", "fenced"}, {"v", kProtocolVersion}, {"reason", f->reason}};
    if (f->excluded_for) x["excluded_for_ms"] = ms(*f->excluded_for);
    return x;
  }
  if (const auto* r = std::get_if<out::Resumed>(&o)) {
    return {{"type", "resumed"}, {"v", kProtocolVersion}, {"round", r->round}};
  }
  if (const auto* w = std::get_if<out::Waiting>(&o)) {
    json x = {{"type", "waiting"},
              {"v", kProtocolVersion},
              {"round", w->round},
              {"joined", w->joined},
              {"waiting", w->waiting},
              {"min_nodes", w->min_nodes},
              {"max_nodes", w->max_nodes},
              {"join_timeout_left_ms", w->join_timeout_left.count()}};
    // A field older agents ignore.
    if (w->last_call_left) x["last_call_left_ms"] = w->last_call_left->count();
    return x;
  }
  if (const auto* l = std::get_if<out::Log>(&o)) {
    // Never sent: the server logs these.
    return {{"type", "log"}, {"v", kProtocolVersion}, {"message", l->text}};
  }
  const auto& f = std::get<out::Finished>(o);
  json j = {{"type", "finished"}, {"v", kProtocolVersion}, {"success", f.success}, {"message", f.message}};
  if (f.root_cause) j["root_cause"] = to_json(*f.root_cause);
  return j;
}

json error_message(Code code, const std::string& message) {
  return {{"type", "error"}, {"v", kProtocolVersion}, {"code", code_name(code)}, {"message", message}};
}

namespace {

Code code_from_name(const std::string& name) {
  for (Code c : {Code::invalid_argument, Code::not_found, Code::already_exists, Code::timeout, Code::unavailable,
                 Code::closed, Code::auth_failed, Code::io_error, Code::internal}) {
    if (name == code_name(c)) return c;
  }
  return Code::internal;
}

}  // namespace

Result<ServerMessage> server_message_from_json(const json& j) {
  std::string type;
  Fields head(j, "a message from the rendezvous");
  head.string("type", kMaxNameLength, type);
  if (!head.ok()) return head.status();
  if (type == "assign") {
    out::Assign a;
    Fields f(j, "assign");
    get_placement(f, a);
    f.names("features", a.features);
    if (!f.ok()) return f.status();
    if (auto st = check_placement(a, "assign"); !st.ok()) return st;
    return ServerMessage(a);
  }
  if (type == "restart") {
    out::Restart r;
    Fields f(j, "restart");
    f.integer("next_round", 0, kMaxInt, r.next_round);
    f.boolean("counts_as_failure", r.counts_as_failure);
    f.string("reason", kMaxTextLength, r.reason);
    if (!f.ok()) return f.status();
    return ServerMessage(r);
  }
  if (type == "reject" || type == "error") {
    std::string code;
    std::string message;
    Fields f(j, type);
    f.string("code", kMaxNameLength, code);
    f.string("message", kMaxTextLength, message);
    if (!f.ok()) return f.status();
    if (type == "error") return ServerMessage(ErrorMessage{code, message});
    return ServerMessage(out::Reject{0, code_from_name(code), message});
  }
  if (type == "finished") {
    out::Finished fin;
    Fields f(j, "finished");
    f.boolean("success", fin.success);
    f.string("message", kMaxTextLength, fin.message);
    const json* root = f.object("root_cause", false);
    if (!f.ok()) return f.status();
    if (root != nullptr) {
      auto decoded = failure_from_json(*root);
      if (!decoded.ok()) return decoded.status();
      fin.root_cause = std::move(decoded).value();
    }
    return ServerMessage(fin);
  }
  if (type == "heartbeat_ack") {
    HeartbeatAck x;
    long long seq = 0;
    Fields f(j, "heartbeat_ack");
    f.integer("seq", 0, std::numeric_limits<long long>::max(), seq);
    if (!f.ok()) return f.status();
    x.seq = static_cast<uint64_t>(seq);
    return ServerMessage(x);
  }
  if (type == "fenced") {
    out::Fenced x;
    Fields f(j, "fenced");
    f.string("reason", kMaxTextLength, x.reason);
    long long excluded_ms = 0;
    bool excluded = f.integer("excluded_for_ms", 0, kMaxTimeoutMs, excluded_ms, false);
    if (!f.ok()) return f.status();
    if (excluded) x.excluded_for = Duration(excluded_ms);
    return ServerMessage(x);
  }
  if (type == "dump_stacks") {
    out::DumpStacks x;
    Fields f(j, "dump_stacks");
    f.string("reason", kMaxTextLength, x.reason);
    if (!f.ok()) return f.status();
    return ServerMessage(x);
  }
  if (type == "resumed") {
    out::Resumed x;
    Fields f(j, "resumed");
    f.integer("round", 0, kMaxInt, x.round);
    if (!f.ok()) return f.status();
    return ServerMessage(x);
  }
  if (type == "waiting") {
    out::Waiting x;
    long long left = 0;
    Fields f(j, "waiting");
    f.integer("round", 0, kMaxInt, x.round);
    f.integer("joined", 0, kMaxNodes, x.joined);
    f.integer("waiting", 0, kMaxInt, x.waiting);
    f.integer("min_nodes", 1, kMaxNodes, x.min_nodes);
    f.integer("max_nodes", 1, kMaxNodes, x.max_nodes);
    f.integer("join_timeout_left_ms", 0, kMaxTimeoutMs, left);
    long long last_call = 0;
    bool closing = f.integer("last_call_left_ms", 0, kMaxTimeoutMs, last_call, false);
    if (!f.ok()) return f.status();
    x.join_timeout_left = Duration(left);
    if (closing) x.last_call_left = Duration(last_call);
    return ServerMessage(x);
  }
  return invalid_argument("unknown message type '" + log_excerpt(type, 64) + "' from the rendezvous");
}


json to_json(const HungMessage& m) {
  return {{"type", "hung"}, {"v", kProtocolVersion}, {"round", m.round}, {"global_rank", m.global_rank}};
}

Result<HungMessage> hung_from_json(const json& j) {
  HungMessage m;
  Fields f(j, "hung");
  f.integer("round", 0, kMaxInt, m.round);
  f.integer("global_rank", 0, kMaxInt, m.global_rank);
  if (!f.ok()) return f.status();
  return m;
}

json to_json(const StacksQuery& q) { return {{"type", "stacks"}, {"v", kProtocolVersion}, {"job", q.job}}; }

Result<StacksQuery> stacks_query_from_json(const json& j) {
  StacksQuery q;
  Fields f(j, "stacks");
  f.string("job", kMaxNameLength, q.job);
  if (!f.ok()) return f.status();
  return q;
}

json to_json(const StacksReply& r) {
  return {{"type", "stacks"}, {"v", kProtocolVersion}, {"state", r.state}, {"asked", r.asked}, {"unable", r.unable}};
}

Result<StacksReply> stacks_reply_from_json(const json& j) {
  StacksReply r;
  Fields f(j, "stacks");
  f.string("state", kMaxNameLength, r.state);
  f.integer("asked", 0, kMaxNodes, r.asked);
  f.integer("unable", 0, kMaxNodes, r.unable);
  if (!f.ok()) return f.status();
  return r;
}

json to_json(const UnhealthySummary& u) {
  return {{"node", u.node},         {"address", u.address}, {"role", u.role},
          {"failures", u.failures}, {"detail", u.detail},   {"reported_ms_ago", u.reported_ms_ago},
          {"retry_in_ms", u.retry_in_ms}};
}

json to_json(const HealthReport& r) {
  json j = {{"type", "health"},       {"v", kProtocolVersion}, {"job", r.job},
            {"node", r.node},         {"address", r.address},  {"role", r.role},
            {"failures", r.failures}, {"detail", r.detail},    {"retry_in_ms", r.retry_in_ms}};
  if (r.check_timeout_ms > 0) j["check_timeout_ms"] = r.check_timeout_ms;
  return j;
}

Result<HealthReport> health_report_from_json(const json& j) {
  HealthReport r;
  Fields f(j, "health");
  f.string("job", kMaxNameLength, r.job);
  f.string("node", kMaxNameLength, r.node);
  f.string("address", kMaxNameLength, r.address);
  f.string("role", kMaxNameLength, r.role);
  f.integer("failures", 1, kMaxInt, r.failures);
  f.string("detail", kMaxHealthDetail, r.detail);
  f.integer("retry_in_ms", 0, kMaxTimeoutMs, r.retry_in_ms);
  f.integer("check_timeout_ms", 0, kMaxTimeoutMs, r.check_timeout_ms, false);
  if (!f.ok()) return f.status();
  if (r.node.empty()) return invalid_argument("health: \"node\" must not be empty");
  return r;
}

json health_noted_message() { return {{"type", "health_noted"}, {"v", kProtocolVersion}}; }

std::string error_text(const json& j) {
  auto e = server_message_from_json(j);
  if (e.ok() && std::holds_alternative<ErrorMessage>(e.value())) return std::get<ErrorMessage>(e.value()).message;
  return dump_message(j);
}

}  // namespace muster::rendezvous
