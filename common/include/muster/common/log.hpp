// The one log sink of a process, set at main. Lines go to stderr in the
// glog-like layout torchrun's own logs use:
//   W1202 16:13:36.952000 5422 muster] message
// Every line of a multi-line message gets the prefix.
#pragma once

#include <functional>
#include <string_view>

namespace muster::log {

enum class Level { debug = 0, info = 1, warning = 2, error = 3 };

// Reads LOGLEVEL (DEBUG, INFO, WARNING, ERROR; default WARNING), as torchrun does.
void init_from_env(std::string_view component);
void set_level(Level level);
bool enabled(Level level);
void write(Level level, std::string_view message);
// Where formatted lines go instead of a blocking write to stderr (the agent
// hands them to its AsyncWriter); nullptr restores the direct write. A forked
// child must reset it before it logs.
using Writer = std::function<void(std::string_view line)>;
void set_writer(Writer writer);

inline void debug(std::string_view m) { write(Level::debug, m); }
inline void info(std::string_view m) { write(Level::info, m); }
inline void warning(std::string_view m) { write(Level::warning, m); }
inline void error(std::string_view m) { write(Level::error, m); }

}  // namespace muster::log
