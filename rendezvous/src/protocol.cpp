#include "muster/rendezvous/protocol.hpp"

namespace muster::rendezvous {

using nlohmann::json;

std::string encode_frame(const json& message) {
  std::string payload = message.dump();
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
  if (offset_ > 65536 && offset_ * 2 > buffer_.size()) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  return std::optional<std::string>(std::move(payload));
}

Result<json> parse_message(std::string_view payload) {
  json j = json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("the message is not a JSON object");
  if (!j.contains("type") || !j["type"].is_string()) return invalid_argument("the message has no \"type\"");
  if (!j.contains("v") || !j["v"].is_number_integer()) return invalid_argument("the message has no protocol \"v\"");
  if (j["v"].get<int>() != kProtocolVersion) {
    return invalid_argument("protocol version " + std::to_string(j["v"].get<int>()) + " is not supported (this is " +
                            std::to_string(kProtocolVersion) + "); use agents and daemon of the same release");
  }
  return j;
}

namespace {

long long ms(Duration d) { return d.count(); }

template <typename T>
bool read(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return true;
  try {
    out = it->get<T>();
    return true;
  } catch (const json::exception&) {
    return false;
  }
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
  return r;
}

Result<JoinMessage> join_from_json(const json& j) {
  JoinMessage m;
  int node_rank = -1;
  bool ok = read(j, "job", m.job) && read(j, "node", m.request.node_name) && read(j, "address", m.request.address) &&
            read(j, "local_world_size", m.request.local_world_size) && read(j, "role", m.request.role) &&
            read(j, "store_port", m.request.store_port) && read(j, "is_host", m.request.is_host) &&
            read(j, "node_rank", node_rank);
  if (!ok) return invalid_argument("a join field has the wrong type");
  if (m.job.empty()) return invalid_argument("a join needs \"job\" (the rdzv_id)");
  if (j.contains("node_rank")) m.request.node_rank = node_rank;
  if (j.contains("settings")) {
    const auto& s = j["settings"];
    if (!s.is_object()) return invalid_argument("\"settings\" must be an object");
    long long join_ms = ms(m.settings.join_timeout), last_ms = ms(m.settings.last_call_timeout),
              close_ms = ms(m.settings.close_timeout), keep_ms = ms(m.settings.keep_alive_interval);
    ok = read(s, "min_nodes", m.settings.min_nodes) && read(s, "max_nodes", m.settings.max_nodes) &&
         read(s, "max_restarts", m.settings.max_restarts) && read(s, "join_timeout_ms", join_ms) &&
         read(s, "last_call_timeout_ms", last_ms) && read(s, "close_timeout_ms", close_ms) &&
         read(s, "keep_alive_interval_ms", keep_ms) &&
         read(s, "keep_alive_max_attempt", m.settings.keep_alive_max_attempt) &&
         read(s, "static", m.settings.static_ranks);
    if (!ok) return invalid_argument("a join setting has the wrong type");
    m.settings.join_timeout = Duration(join_ms);
    m.settings.last_call_timeout = Duration(last_ms);
    m.settings.close_timeout = Duration(close_ms);
    m.settings.keep_alive_interval = Duration(keep_ms);
  }
  const auto& s = m.settings;
  if (s.min_nodes < 1 || s.max_nodes < s.min_nodes) {
    return invalid_argument("min_nodes must be > 0 and <= max_nodes, got min_nodes=" + std::to_string(s.min_nodes) +
                            ", max_nodes=" + std::to_string(s.max_nodes));
  }
  if (s.keep_alive_interval.count() <= 0 || s.keep_alive_max_attempt < 1 || s.join_timeout.count() <= 0 ||
      s.last_call_timeout.count() < 0 || s.max_restarts < 0) {
    return invalid_argument("the join's timeouts must be positive and max_restarts >= 0");
  }
  return m;
}

json to_json(const FailureInfo& f) {
  return {{"global_rank", f.global_rank}, {"local_rank", f.local_rank}, {"exitcode", f.exitcode},
          {"host", f.host},               {"message", f.message},       {"timestamp", f.timestamp}};
}

Result<FailureInfo> failure_from_json(const json& j) {
  FailureInfo f;
  if (!j.is_object()) return invalid_argument("\"failure\" must be an object");
  bool ok = read(j, "global_rank", f.global_rank) && read(j, "local_rank", f.local_rank) &&
            read(j, "exitcode", f.exitcode) && read(j, "host", f.host) && read(j, "message", f.message) &&
            read(j, "timestamp", f.timestamp);
  if (!ok) return invalid_argument("a failure field has the wrong type");
  return f;
}

json to_json(const Output& o) {
  if (const auto* a = std::get_if<out::Assign>(&o)) {
    return {{"type", "assign"},
            {"v", kProtocolVersion},
            {"round", a->round},
            {"restart_count", a->restart_count},
            {"group_rank", a->group_rank},
            {"group_world_size", a->group_world_size},
            {"base_global_rank", a->ranks.base_global_rank},
            {"global_world_size", a->ranks.global_world_size},
            {"base_role_rank", a->ranks.base_role_rank},
            {"role_world_size", a->ranks.role_world_size},
            {"master_addr", a->master_addr},
            {"master_port", a->master_port}};
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
  const auto& f = std::get<out::Finished>(o);
  json j = {{"type", "finished"}, {"v", kProtocolVersion}, {"success", f.success}, {"message", f.message}};
  if (f.root_cause) j["root_cause"] = to_json(*f.root_cause);
  return j;
}

json error_message(Code code, const std::string& message) {
  return {{"type", "error"}, {"v", kProtocolVersion}, {"code", code_name(code)}, {"message", message}};
}

}  // namespace muster::rendezvous
