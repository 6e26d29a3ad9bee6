// The -r/--redirects and -t/--tee values: one of 0-3 for every local rank, or
// a per-rank map such as "0:1,3:2". Bit 1 is stdout, bit 2 stderr.
#pragma once

#include <map>
#include <string_view>

#include "muster/common/status.hpp"

namespace muster::launcher {

enum StdBits : unsigned { kStdNone = 0, kStdOut = 1, kStdErr = 2, kStdAll = 3 };

class StdSpec {
 public:
  StdSpec() = default;
  static Result<StdSpec> parse(std::string_view text);

  unsigned for_rank(int local_rank) const;

 private:
  bool uniform_ = true;
  unsigned all_ = kStdNone;
  std::map<int, unsigned> per_rank_;
};

}  // namespace muster::launcher
