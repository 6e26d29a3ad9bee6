#include "muster/common/text.hpp"

#include <algorithm>

namespace muster {

std::string log_excerpt(std::string_view text, std::size_t limit) {
  std::string out;
  std::size_t n = std::min(text.size(), limit);
  out.reserve(n + 32);
  for (std::size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > limit) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace muster
