// --rdzv-conf "k1=v1,k2=v2": torchrun's parsing rules and error texts.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher {

using RdzvConf = std::map<std::string, std::string>;

Result<RdzvConf> parse_rdzv_conf(std::string_view text);

// 1,true,t,yes,y / 0,false,f,no,n, any case; `fallback` when the key is absent.
Result<bool> rdzv_conf_bool(const RdzvConf& conf, const std::string& key, bool fallback);
// A Python int(); `fallback` when the key is absent.
Result<long long> rdzv_conf_int(const RdzvConf& conf, const std::string& key, long long fallback);

// The keys muster's rendezvous reads, resolved once when the command line is:
// a bad value is refused before anything starts.
struct RendezvousOptions {
  // join_timeout (600 s); the static backend's `timeout` (900 s from torchrun).
  std::chrono::milliseconds join_timeout{600'000};
  std::chrono::milliseconds last_call_timeout{30'000};
  std::chrono::milliseconds close_timeout{30'000};
  std::chrono::milliseconds keep_alive_interval{5'000};
  int keep_alive_max_attempt = 3;
  // How long an agent whose rendezvous connection broke reconnects (60 s).
  std::chrono::milliseconds reconnect_timeout{60'000};
  // is_host: whether this agent hosts a c10d rendezvous (absent: when the
  // endpoint is one of this machine's addresses).
  std::optional<bool> is_host;
  // exclude_after: a node that was the root cause of this many failed
  // attempts in a row is excluded (0: never); exclude_cooldown: its first
  // exclusion's length (60 s), doubling with each exclusion.
  int exclude_after = 0;
  std::chrono::milliseconds exclude_cooldown{60'000};
};

// Seconds as a number (a Python float), longer than a year read as a year
// (with a line in `warnings`).
Result<RendezvousOptions> resolve_rendezvous_options(const RdzvConf& conf, bool static_backend,
                                                     std::vector<std::string>& warnings);

}  // namespace muster::launcher
