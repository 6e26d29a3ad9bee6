#include "group_settings.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace muster::detail {

namespace {

int env_int(const char* name, std::optional<int> given, const char* field, std::optional<int> fallback = {}) {
  if (given) return *given;
  auto v = env(name);
  if (!v) {
    if (fallback) return *fallback;
    throw Error(std::string("muster: ") + name + " is not set; run the program under muster or torchrun, or set ProcessGroupOptions::" +
                field);
  }
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0 || x < INT32_MIN || x > INT32_MAX) {
    throw Error(std::string("muster: ") + name + "='" + *v + "' is not an integer");
  }
  return static_cast<int>(x);
}

bool valid_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }

}  // namespace

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

GroupSettings read_group_settings(const ProcessGroupOptions& o) {
  GroupSettings s;
  s.rank = env_int("RANK", o.rank, "rank");
  s.world = env_int("WORLD_SIZE", o.world_size, "world_size");
  if (s.world < 1) throw Error("muster: WORLD_SIZE must be at least 1, got " + std::to_string(s.world));
  if (s.rank < 0 || s.rank >= s.world) {
    throw Error("muster: RANK " + std::to_string(s.rank) + " is outside [0, " + std::to_string(s.world) + ")");
  }
  if (o.local_rank || env("LOCAL_RANK")) s.local_rank = env_int("LOCAL_RANK", o.local_rank, "local_rank");
  if (o.local_world_size || env("LOCAL_WORLD_SIZE")) {
    s.local_size = env_int("LOCAL_WORLD_SIZE", o.local_world_size, "local_world_size");
  }
  s.restart = env_int("TORCHELASTIC_RESTART_COUNT", o.restart_count, "restart_count", 0);
  s.timeout = o.timeout;
  if (s.timeout.count() <= 0) throw Error("muster: the process group's timeout must be positive");
  if (o.backend != "cpu") {
    throw Error("muster: backend '" + o.backend +
                "' is not a ProcessGroup backend; use \"cpu\" (NCCL: muster::NcclCommunicator in muster/nccl.hpp)");
  }
  if (!o.name.empty() &&
      (o.name.size() > kMaxGroupName || !std::all_of(o.name.begin(), o.name.end(), valid_name_char))) {
    throw Error("muster: the group name '" + o.name + "' must be 1-" + std::to_string(kMaxGroupName) +
                " letters, digits, '_', '-' or '.'");
  }
  s.name = o.name;

  s.master_addr = o.master_addr ? *o.master_addr : env("MASTER_ADDR").value_or("");
  if (s.master_addr.empty()) {
    throw Error("muster: MASTER_ADDR is not set; run the program under muster or torchrun, or set ProcessGroupOptions::master_addr");
  }
  s.master_port = env_int("MASTER_PORT", o.master_port, "master_port");
  if (s.master_port < 0 || s.master_port > 65535) {
    throw Error("muster: MASTER_PORT " + std::to_string(s.master_port) + " is not a port");
  }
  s.agent_store = o.use_agent_store ? *o.use_agent_store : env("TORCHELASTIC_USE_AGENT_STORE") == std::string("True");

  std::string transport = env("MUSTER_CPU_TRANSPORT").value_or("auto");
  if (transport != "auto" && transport != "tcp") {
    throw Error("muster: MUSTER_CPU_TRANSPORT='" + transport + "' is not one of auto, tcp");
  }
  s.tcp_only = transport == "tcp";
  if (auto id = env("MUSTER_NODE_ID"); id && !id->empty()) s.node_id = *id;
  if (auto text = env("MUSTER_SHM_SLOT_BYTES")) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(text->c_str(), &end, 10);
    if (text->empty() || *end != '\0' || v < 4096 || v % 4096 != 0 || v > (1ull << 30)) {
      throw Error("muster: MUSTER_SHM_SLOT_BYTES='" + *text + "' must be a multiple of 4096 between 4096 and 2^30");
    }
    s.slot_bytes = v;
  }
  return s;
}

}  // namespace muster::detail
