// torchrun's log directory layout:
//   <base>/<run_id>_<8 random>/attempt_<restart>/<local_rank>/{stdout.log,stderr.log,error.json}
// <base> is --log-dir (created with its parents) or a new torchelastic_<8 random>
// directory in $TMPDIR. "--log-dir /dev/null" turns files off altogether.
#pragma once

#include <optional>
#include <string>

#include "muster/common/status.hpp"

namespace muster::launcher {

class LogDirectory {
 public:
  // Creates the run directory (lazily, at the first worker start, as torchrun does).
  static Result<LogDirectory> create(const std::optional<std::string>& base, const std::string& run_id,
                                     const std::string& tmpdir);

  bool disabled() const { return disabled_; }
  const std::string& run_dir() const { return run_dir_; }

  // Empties and recreates attempt_<n> with one directory per local rank.
  Result<std::string> prepare_attempt(int restart_count, int nproc);
  std::string rank_dir(const std::string& attempt_dir, int local_rank) const;

 private:
  bool disabled_ = false;
  std::string run_dir_;
};

// mkdir of prefix + 8 random characters of [a-z0-9_], as Python's mkdtemp names them.
Result<std::string> make_unique_dir(const std::string& parent, const std::string& prefix);

}  // namespace muster::launcher
