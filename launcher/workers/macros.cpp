#include "macros.hpp"

#include <cctype>

namespace muster::launcher {
namespace {

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

}  // namespace

std::string safe_substitute(std::string_view text, const std::map<std::string, std::string>& values) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '$' || i + 1 == text.size()) {
      out.push_back(text[i++]);
      continue;
    }
    char next = text[i + 1];
    if (next == '$') {
      out.push_back('$');
      i += 2;
      continue;
    }
    if (next == '{') {
      std::size_t close = text.find('}', i + 2);
      if (close != std::string_view::npos) {
        std::string name(text.substr(i + 2, close - i - 2));
        auto it = values.find(name);
        if (it != values.end()) {
          out += it->second;
          i = close + 1;
          continue;
        }
      }
      out.push_back(text[i++]);
      continue;
    }
    if (ident_start(next)) {
      std::size_t end = i + 1;
      while (end < text.size() && ident_char(text[end])) ++end;
      std::string name(text.substr(i + 1, end - i - 1));
      auto it = values.find(name);
      out += it != values.end() ? it->second : std::string(text.substr(i, end - i));
      i = end;
      continue;
    }
    out.push_back(text[i++]);
  }
  return out;
}

}  // namespace muster::launcher
