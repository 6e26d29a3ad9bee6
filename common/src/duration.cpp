#include "muster/common/duration.hpp"

#include <cstdio>

namespace muster {

std::string seconds_text(std::chrono::milliseconds d) {
  long long ms = d.count();
  const char* sign = ms < 0 ? "-" : "";
  unsigned long long a = ms < 0 ? 0ULL - static_cast<unsigned long long>(ms) : static_cast<unsigned long long>(ms);
  char buf[48];
  if (a % 1000 == 0) {
    std::snprintf(buf, sizeof buf, "%s%llu s", sign, a / 1000);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%s%llu.%03llu", sign, a / 1000, a % 1000);
  std::string out = buf;
  while (out.back() == '0') out.pop_back();
  return out + " s";
}

}  // namespace muster
