// torchrun's command line: its options (both spellings of every multi-word
// option, PET_<DEST> defaults, torchrun's defaults and help texts) and muster's
// own few, parsed by the argparse engine. config_from_args.hpp turns the
// result into a LaunchConfig.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "argparse.hpp"

namespace muster::launcher {

// argv without the program name. Errors are the text after "muster: error: ".
Result<ParsedArgs> parse_args(const std::vector<std::string>& argv, const Environment& env);

// The option table as documentation (for the man page): the same source as
// parse_args and help_text.
struct OptionDoc {
  std::vector<std::string> names;
  std::string metavar;  // empty for a flag
  std::vector<std::string> choices;
  std::optional<std::string> default_value;
  bool pet = false;  // reads PET_<DEST>
  std::string dest;
  std::string help;
};
std::vector<OptionDoc> option_docs();

std::string usage_text(const std::string& prog);
std::string help_text(const std::string& prog);

}  // namespace muster::launcher
