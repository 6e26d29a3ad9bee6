// Signal names as Python's signal.Signals spells them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace muster::launcher {

// "SIGTERM" for 15; an empty string for a number with no name.
std::string signal_name(int signo);
// Accepts "SIGTERM"; nullopt for an unknown name.
std::optional<int> signal_from_name(std::string_view name);

}  // namespace muster::launcher
