#include "std_spec.hpp"

#include <cctype>
#include <string>

namespace muster::launcher {

Result<StdSpec> StdSpec::parse(std::string_view text) {
  auto bad = [&] {
    return invalid_argument(std::string(text) +
                            " does not match: <^[0123]$> or <^(\\d+:[0123],)*(\\d+:[0123])$>");
  };
  StdSpec spec;
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '3') {
    spec.all_ = static_cast<unsigned>(text[0] - '0');
    return spec;
  }
  // Per-rank map. torchrun accepts single-digit ranks only; muster accepts any
  // number of digits so nodes with more than ten workers can be addressed.
  spec.uniform_ = false;
  std::size_t pos = 0;
  if (text.empty()) return bad();
  while (pos < text.size()) {
    std::size_t digits = pos;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
    if (digits == pos || digits - pos > 6 || digits + 2 > text.size() || text[digits] != ':') return bad();
    char v = text[digits + 1];
    if (v < '0' || v > '3') return bad();
    int rank = std::stoi(std::string(text.substr(pos, digits - pos)));
    spec.per_rank_[rank] = static_cast<unsigned>(v - '0');
    pos = digits + 2;
    if (pos == text.size()) break;
    if (text[pos] != ',' || pos + 1 == text.size()) return bad();
    ++pos;
  }
  return spec;
}

unsigned StdSpec::for_rank(int local_rank) const {
  if (uniform_) return all_;
  auto it = per_rank_.find(local_rank);
  return it == per_rank_.end() ? kStdNone : it->second;
}

}  // namespace muster::launcher
