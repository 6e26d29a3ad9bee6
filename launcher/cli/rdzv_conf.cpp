#include "rdzv_conf.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

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

}  // namespace muster::launcher
