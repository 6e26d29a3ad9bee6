// A command-line parser that behaves as Python's argparse does for the parts
// torchrun's parser uses: options by exact name, `--name=value` and `-xVALUE`,
// unique-prefix abbreviations of long options, bundled short flags, `--` to end
// the options, the first positional argument taking everything after it, and
// defaults from PET_<DEST> variables. It knows no option by itself: the table
// it is given (torchrun_options.cpp holds torchrun's) says what exists.
#pragma once

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher {

using Environment = std::map<std::string, std::string>;

struct ParsedArgs {
  // Values by argparse dest (e.g. "nproc_per_node"), from the command line or
  // a PET_ default; options left at a None default are absent.
  std::map<std::string, std::string> values;
  // Options given on the command line (a PET_ default does not count).
  std::map<std::string, bool> given;
  std::map<std::string, bool> flags;
  // Every value of an option that may be given again, in order.
  std::map<std::string, std::vector<std::string>> lists;
  std::string training_script;
  std::vector<std::string> training_script_args;
  bool help = false;
  bool version = false;
};

namespace argparse {

enum class Kind { value, flag, help, version };
enum class Type { str, integer, real };

struct OptionSpec {
  std::vector<std::string> names;  // in argparse order: short, then dashed long, then alias
  Kind kind = Kind::value;
  Type type = Type::str;
  bool pet = true;                          // reads PET_<DEST>
  std::optional<std::string> default_value;  // nullopt: None
  std::vector<std::string> choices;
  std::string help;
  bool torchrun = true;  // false: muster's own option, which torchrun does not have
  bool append = false;   // may be given again: every value is kept, in order (ParsedArgs::lists)

  // argparse's dest: the first long option string, dashes to underscores.
  std::string dest() const {
    for (const auto& n : names) {
      if (n.rfind("--", 0) == 0) {
        std::string d = n.substr(2);
        std::replace(d.begin(), d.end(), '-', '_');
        return d;
      }
    }
    return names.front().substr(1);
  }
  std::string display() const {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : "/") + n;
    return out;
  }
  std::string metavar() const {
    std::string d = dest();
    for (auto& c : d) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return d;
  }
};

using Table = std::vector<OptionSpec>;

// argv without the program name, against table. The first argument that is not
// an option is the script; it and everything after it are passed through.
// Errors are argparse's texts (what follows "prog: error: ").
Result<ParsedArgs> parse(const Table& table, const std::vector<std::string>& argv, const Environment& env);

// PET_<DEST>, upper case: the variable that holds an option's default.
std::string pet_variable(const std::string& dest);

// The usage line argparse prints, wrapped at 79 columns, and one entry per
// option for --help.
std::string usage(const Table& table, const std::string& prog);
std::string options_help(const Table& table);

// Python's int() and float() of a string: surrounding whitespace allowed,
// int() also takes single underscores between digits.
std::optional<long long> parse_python_int(std::string_view text);
std::optional<double> parse_python_float(std::string_view text);
std::string trim(std::string_view s);

}  // namespace argparse
}  // namespace muster::launcher
