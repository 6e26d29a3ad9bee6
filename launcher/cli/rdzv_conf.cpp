#include "rdzv_conf.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "muster/rendezvous/protocol.hpp"

namespace muster::launcher {
namespace {

std::string strip(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

Result<RdzvConf> parse_rdzv_conf(std::string_view text) {
  RdzvConf conf;
  std::string all = strip(text);
  if (all.empty()) return conf;
  std::size_t pos = 0;
  while (pos <= all.size()) {
    std::size_t comma = all.find(',', pos);
    std::string item = all.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    std::size_t eq = item.find('=');
    std::string key = strip(item.substr(0, eq));
    if (key.empty()) {
      return invalid_argument(
          "The rendezvous configuration string must be in format <key1>=<value1>,...,<keyN>=<valueN>.");
    }
    std::string value = eq == std::string::npos ? std::string() : strip(item.substr(eq + 1));
    if (value.empty()) {
      return invalid_argument("The rendezvous configuration option '" + key + "' must have a value specified.");
    }
    conf[key] = value;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  for (const char* reserved : {"backend", "endpoint", "run_id", "min_nodes", "max_nodes", "local_addr"}) {
    if (conf.count(reserved)) {
      return invalid_argument(std::string("--rdzv-conf cannot set '") + reserved +
                              "': it comes from its own command-line option");
    }
  }
  return conf;
}

Result<bool> rdzv_conf_bool(const RdzvConf& conf, const std::string& key, bool fallback) {
  auto it = conf.find(key);
  if (it == conf.end()) return fallback;
  std::string v = it->second;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "1" || v == "true" || v == "t" || v == "yes" || v == "y") return true;
  if (v == "0" || v == "false" || v == "f" || v == "no" || v == "n") return false;
  return invalid_argument("The rendezvous configuration option '" + key +
                          "' does not represent a valid boolean value.");
}

Result<long long> rdzv_conf_int(const RdzvConf& conf, const std::string& key, long long fallback) {
  auto it = conf.find(key);
  if (it == conf.end()) return fallback;
  const std::string v = strip(it->second);
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE) {
    return invalid_argument("The rendezvous configuration option '" + key +
                            "' does not represent a valid integer value.");
  }
  return n;
}

namespace {

Result<std::chrono::milliseconds> conf_seconds(const RdzvConf& conf, const std::string& key, double fallback,
                                               std::vector<std::string>& warnings) {
  auto it = conf.find(key);
  double v = fallback;
  if (it != conf.end()) {
    char* end = nullptr;
    v = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0' || !(v >= 0)) {
      return invalid_argument("The rendezvous configuration option '" + key +
                              "' must be a number of seconds, got '" + it->second + "'");
    }
  }
  // Longer than the protocol's limit (a year) waits as long as that limit.
  constexpr double kMaxMs = static_cast<double>(rendezvous::kMaxTimeoutMs);
  double ms = v * 1000;
  if (!(ms <= kMaxMs)) {
    warnings.push_back("--rdzv-conf " + key + "=" + it->second + " is longer than a year; using a year");
    ms = kMaxMs;
  }
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

}  // namespace

Result<RendezvousOptions> resolve_rendezvous_options(const RdzvConf& conf, bool static_backend,
                                                     std::vector<std::string>& warnings) {
  RendezvousOptions o;
  auto join = static_backend ? conf_seconds(conf, "timeout", 900, warnings)
                             : conf_seconds(conf, "join_timeout", 600, warnings);
  auto last = conf_seconds(conf, "last_call_timeout", 30, warnings);
  auto close = conf_seconds(conf, "close_timeout", 30, warnings);
  auto keep = conf_seconds(conf, "keep_alive_interval", 5, warnings);
  auto attempts = rdzv_conf_int(conf, "keep_alive_max_attempt", 3);
  auto reconnect = conf_seconds(conf, "reconnect_timeout", 60, warnings);
  for (const auto* r : {&join, &last, &close, &keep, &reconnect}) {
    if (!r->ok()) return r->status();
  }
  if (!attempts.ok()) return attempts.status();
  if (keep->count() <= 0 || attempts.value() < 1 || attempts.value() > rendezvous::kMaxKeepAliveAttempts) {
    return invalid_argument("keep_alive_interval must be > 0 and keep_alive_max_attempt in [1, " +
                            std::to_string(rendezvous::kMaxKeepAliveAttempts) + "]");
  }
  if (join->count() <= 0) return invalid_argument("join_timeout must be more than 0 seconds");
  o.join_timeout = join.value();
  o.last_call_timeout = last.value();
  o.close_timeout = close.value();
  o.keep_alive_interval = keep.value();
  o.keep_alive_max_attempt = static_cast<int>(attempts.value());
  o.reconnect_timeout = reconnect.value();
  auto exclude_after = rdzv_conf_int(conf, "exclude_after", 0);
  if (!exclude_after.ok()) return exclude_after.status();
  if (exclude_after.value() < 0 || exclude_after.value() > 1000000) {
    return invalid_argument("--rdzv-conf exclude_after=" + std::to_string(exclude_after.value()) +
                            ": give the failed attempts in a row after which a node is excluded, 1 or more (0: never)");
  }
  o.exclude_after = static_cast<int>(exclude_after.value());
  auto cooldown = conf_seconds(conf, "exclude_cooldown", 60, warnings);
  if (!cooldown.ok()) return cooldown.status();
  // Shorter, a node would be back before the job re-formed without it.
  if (cooldown->count() < 1000) {
    return invalid_argument("--rdzv-conf exclude_cooldown=" + conf.at("exclude_cooldown") +
                            ": give at least 1 second (the first exclusion's length; it doubles with each one)");
  }
  if (*cooldown > std::chrono::hours(1)) {
    warnings.push_back("--rdzv-conf exclude_cooldown=" + conf.at("exclude_cooldown") +
                       " is longer than the longest exclusion, an hour; using an hour");
    cooldown = std::chrono::milliseconds(std::chrono::hours(1));
  }
  o.exclude_cooldown = cooldown.value();
  if (conf.count("is_host")) {
    auto is_host = rdzv_conf_bool(conf, "is_host", false);
    if (!is_host.ok()) return is_host.status();
    o.is_host = is_host.value();
  }
  return o;
}

}  // namespace muster::launcher
