// Python string.Template.safe_substitute, which torchrun applies to worker
// arguments (with local_rank) and to the tee line prefix template (with
// role_name, rank, local_rank): "$name" and "${name}" are replaced when name is
// known, "$$" becomes "$", anything else is left as written.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace muster::launcher {

std::string safe_substitute(std::string_view text, const std::map<std::string, std::string>& values);

inline std::string substitute_local_rank(std::string_view arg, int local_rank) {
  return safe_substitute(arg, {{"local_rank", std::to_string(local_rank)}});
}

}  // namespace muster::launcher
