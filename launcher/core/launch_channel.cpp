#include "launch_channel.hpp"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "signals.hpp"

namespace muster::launcher::channel {

using nlohmann::json;

namespace {
Status bad(const std::string& why) { return Status(Code::invalid_argument, "launch channel: " + why); }
}  // namespace

bool valid_env_name(std::string_view name) {
  if (name.empty() || name.size() > 256) return false;
  if (!(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

std::string encode_header(const Header& h) {
  json j = {{"channel", kChannelVersion},
            {"version", h.version},
            {"order", h.order},
            {"heartbeat_ms", h.heartbeat_ms},
            {"rdzv_endpoint", h.rdzv_endpoint},
            {"env", h.env}};
  if (h.key_hex) j["key"] = *h.key_hex;
  // resolve_fanout refuses text that is not UTF-8; never throw here.
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

Result<Header> decode_header(std::string_view line) {
  if (line.size() > kMaxHeaderBytes) return bad("the header is longer than " + std::to_string(kMaxHeaderBytes) + " bytes");
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("the header is not a JSON object");
  auto channel = j.find("channel");
  if (channel == j.end() || !channel->is_number_integer() || channel->get<int64_t>() != kChannelVersion) {
    return bad("the header's channel version is not " + std::to_string(kChannelVersion));
  }
  Header h;
  auto str = [&](const char* key, std::string& out, std::size_t limit) -> Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return bad(std::string("the header's ") + key + " is missing or not a string");
    if (it->get_ref<const std::string&>().size() > limit) return bad(std::string("the header's ") + key + " is too long");
    out = it->get<std::string>();
    return {};
  };
  auto integer = [&](const char* key, int low, int high, int& out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) return bad(std::string("the header's ") + key + " is missing or not an integer");
    auto v = it->get<int64_t>();
    if (v < low || v > high) return bad(std::string("the header's ") + key + " is out of range");
    out = static_cast<int>(v);
    return {};
  };
  if (auto st = str("version", h.version, 128); !st.ok()) return st;
  if (auto st = integer("order", 0, 1 << 20, h.order); !st.ok()) return st;
  if (auto st = integer("heartbeat_ms", 10, 60000, h.heartbeat_ms); !st.ok()) return st;
  if (auto st = str("rdzv_endpoint", h.rdzv_endpoint, 1024); !st.ok()) return st;
  if (j.contains("key")) {
    std::string key;
    if (auto st = str("key", key, 1024); !st.ok()) return st;
    if (key.empty() || key.size() % 2 != 0 ||
        !std::all_of(key.begin(), key.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
      return bad("the header's key is not hex");
    }
    h.key_hex = std::move(key);
  }
  auto env = j.find("env");
  if (env == j.end() || !env->is_object()) return bad("the header's env is missing or not an object");
  if (env->size() > kMaxEnvEntries) return bad("the header's env has more than " + std::to_string(kMaxEnvEntries) + " entries");
  for (const auto& [name, value] : env->items()) {
    if (!valid_env_name(name)) return bad("the header's env has a bad name '" + name.substr(0, 64) + "'");
    if (!value.is_string()) return bad("the header's env value of " + name + " is not a string");
    const auto& v = value.get_ref<const std::string&>();
    if (v.find('\0') != std::string::npos) return bad("the header's env value of " + name + " holds a NUL byte");
    h.env.emplace(name, v);
  }
  return h;
}

std::string encode(const Record& r) {
  if (std::holds_alternative<record::Heartbeat>(r)) return "h\n";
  return "stop " + signal_name(std::get<record::Stop>(r).signo) + "\n";
}

Result<Record> decode_record(std::string_view line) {
  if (line.size() > kMaxRecordBytes) return bad("a record is longer than " + std::to_string(kMaxRecordBytes) + " bytes");
  if (line == "h") return Record{record::Heartbeat{}};
  if (line.rfind("stop ", 0) == 0) {
    auto signo = signal_from_name(line.substr(5));
    if (!signo) return bad("a stop record names no signal: '" + std::string(line.substr(0, 64)) + "'");
    return Record{record::Stop{*signo}};
  }
  return bad("an unknown record: '" + std::string(line.substr(0, 64)) + "'");
}

Result<std::string> resolve_endpoint(const std::string& endpoint, const std::string& ssh_connection) {
  if (endpoint.empty() || endpoint.front() != ':') return endpoint;
  auto space = ssh_connection.find(' ');
  std::string client = ssh_connection.substr(0, space);
  if (space == std::string::npos || client.empty()) {
    return bad("the rendezvous is at the launching host's address, but SSH_CONNECTION does not name it; give "
               "--rdzv-endpoint=HOST:PORT to the launching command");
  }
  if (client.find(':') != std::string::npos) client = "[" + client + "]";
  return client + endpoint;
}

}  // namespace muster::launcher::channel
