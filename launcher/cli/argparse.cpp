#include "argparse.hpp"

#include <cstdlib>

namespace muster::launcher::argparse {
namespace {

const OptionSpec* find_exact(const Table& table, const std::string& name) {
  for (const auto& spec : table) {
    if (std::find(spec.names.begin(), spec.names.end(), name) != spec.names.end()) return &spec;
  }
  return nullptr;
}

bool is_negative_number(const std::string& s) {
  if (s.size() < 2 || s[0] != '-') return false;
  std::size_t i = 1;
  bool digits = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) { ++i; digits = true; }
  if (i == s.size()) return digits;
  if (s[i] != '.') return false;
  ++i;
  bool frac = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) { ++i; frac = true; }
  return i == s.size() && frac;
}

struct Match {
  const OptionSpec* spec = nullptr;
  std::string option_string;
  std::optional<std::string> explicit_arg;
};

// argparse's _parse_optional: nullopt means "a positional argument".
Result<std::optional<Match>> classify(const Table& table, const std::string& arg) {
  using Out = std::optional<Match>;
  if (arg.empty() || arg[0] != '-' || arg == "-") return Out{};
  if (const auto* spec = find_exact(table, arg)) return Out{Match{spec, arg, std::nullopt}};
  if (auto eq = arg.find('='); eq != std::string::npos) {
    std::string name = arg.substr(0, eq);
    if (const auto* spec = find_exact(table, name)) return Out{Match{spec, name, arg.substr(eq + 1)}};
  }
  std::vector<Match> tuples;
  if (arg.rfind("--", 0) == 0) {
    auto eq = arg.find('=');
    std::string prefix = eq == std::string::npos ? arg : arg.substr(0, eq);
    std::optional<std::string> explicit_arg;
    if (eq != std::string::npos) explicit_arg = arg.substr(eq + 1);
    for (const auto& spec : table) {
      for (const auto& n : spec.names) {
        if (n.rfind(prefix, 0) == 0) tuples.push_back({&spec, n, explicit_arg});
      }
    }
  } else {
    std::string short_prefix = arg.substr(0, 2);
    std::string short_explicit = arg.substr(2);
    for (const auto& spec : table) {
      for (const auto& n : spec.names) {
        if (n == short_prefix) tuples.push_back({&spec, n, short_explicit});
        else if (n.rfind(arg, 0) == 0) tuples.push_back({&spec, n, std::nullopt});
      }
    }
  }
  // An abbreviation that is unique among torchrun's own options keeps the
  // meaning it has under torchrun, whatever options muster adds
  // (`--he` is still --help beside --health-check).
  if (tuples.size() > 1) {
    std::vector<Match> torchrun;
    for (const auto& t : tuples) {
      if (t.spec->torchrun) torchrun.push_back(t);
    }
    if (torchrun.size() == 1) return Out{torchrun.front()};
  }
  if (tuples.size() > 1) {
    std::string names;
    for (const auto& t : tuples) names += (names.empty() ? "" : ", ") + t.option_string;
    return invalid_argument("ambiguous option: " + arg.substr(0, arg.find('=')) + " could match " + names);
  }
  if (tuples.size() == 1) return Out{tuples.front()};
  if (is_negative_number(arg)) return Out{};
  if (arg.find(' ') != std::string::npos) return Out{};
  return Out{Match{nullptr, arg, std::nullopt}};
}

}  // namespace

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// Python int(): surrounding whitespace, a sign, digits with single underscores between.
std::optional<long long> parse_python_int(std::string_view text) {
  std::string s = trim(text);
  std::size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) return std::nullopt;
  long long value = 0;
  bool last_digit = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_' && last_digit && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      last_digit = false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    if (value > (1LL << 52)) return std::nullopt;
    value = value * 10 + (c - '0');
    last_digit = true;
  }
  return negative ? -value : value;
}

std::optional<double> parse_python_float(std::string_view text) {
  std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

std::string pet_variable(const std::string& dest) {
  std::string name = "PET_" + dest;
  for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

namespace {

Status check_type(const OptionSpec& spec, const std::string& value) {
  if (spec.type == Type::integer && !parse_python_int(value)) {
    return invalid_argument("argument " + spec.display() + ": invalid int value: '" + value + "'");
  }
  if (spec.type == Type::real && !parse_python_float(value)) {
    return invalid_argument("argument " + spec.display() + ": invalid float value: '" + value + "'");
  }
  return {};
}

// Whether argv[j] can be an option's value: it exists and is not an option.
Result<bool> next_is_value(const Table& table, const std::vector<std::string>& argv, std::size_t j) {
  if (j >= argv.size() || argv[j] == "--") return false;
  auto c = classify(table, argv[j]);
  if (!c.ok()) return c.status();
  return !c.value().has_value();
}

// A valued option: its explicit value (--name=value, -xVALUE) or the next
// argument, checked against its type and choices.
Status take_value(const Table& table, const std::vector<std::string>& argv, std::size_t& i, const Match& match,
                  ParsedArgs& out) {
  const OptionSpec& spec = *match.spec;
  std::string value;
  if (match.explicit_arg) {
    value = *match.explicit_arg;
  } else {
    auto has = next_is_value(table, argv, i);
    if (!has.ok()) return has.status();
    if (!has.value()) return invalid_argument("argument " + spec.display() + ": expected one argument");
    value = argv[i++];
  }
  if (auto st = check_type(spec, value); !st.ok()) return st;
  if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(), value) == spec.choices.end()) {
    std::string list;
    for (const auto& c : spec.choices) list += (list.empty() ? "'" : ", '") + c + "'";
    return invalid_argument("argument " + spec.display() + ": invalid choice: '" + value + "' (choose from " + list +
                            ")");
  }
  if (spec.append) out.lists[spec.dest()].push_back(value);
  out.values[spec.dest()] = value;
  out.given[spec.dest()] = true;
  return {};
}

// One option string from the command line, and the short options bundled
// behind a short flag (-mh, or -m followed by a short valued option).
Status take_option(const Table& table, const std::vector<std::string>& argv, std::size_t& i, Match match,
                   ParsedArgs& out) {
  while (true) {
    const OptionSpec& spec = *match.spec;
    if (spec.kind == Kind::value) return take_value(table, argv, i, match, out);
    if (spec.kind == Kind::help) {
      out.help = true;
    } else if (spec.kind == Kind::version) {
      out.version = true;
    } else {
      out.flags[spec.dest()] = true;
      out.given[spec.dest()] = true;
    }
    if (!match.explicit_arg) return {};
    const std::string rest = *match.explicit_arg;
    bool is_short = match.option_string.size() == 2 && match.option_string[1] != '-';
    if (is_short && !rest.empty()) {
      std::string next = std::string("-") + rest[0];
      if (const auto* next_spec = find_exact(table, next)) {
        std::optional<std::string> explicit_arg;
        if (rest.size() > 1) explicit_arg = rest.substr(1);
        match = Match{next_spec, next, explicit_arg};
        continue;
      }
    }
    return invalid_argument("argument " + spec.display() + ": ignored explicit argument '" + rest + "'");
  }
}

// What the command line left unset: PET_<DEST> when set, else the coded
// default, with the type applied as argparse does.
Status apply_defaults(const Table& table, const Environment& env, ParsedArgs& out) {
  for (const auto& spec : table) {
    const std::string dest = spec.dest();
    const std::string pet_name = pet_variable(dest);
    auto env_it = spec.pet ? env.find(pet_name) : env.end();
    if (spec.kind == Kind::flag) {
      if (out.flags.count(dest)) continue;
      bool value = false;
      if (env_it != env.end()) {
        auto parsed = parse_python_int(env_it->second);
        if (!parsed) {
          return invalid_argument("the environment variable " + pet_name + "='" + env_it->second +
                                  "' must be an integer (0 or 1), as torchrun requires");
        }
        value = *parsed != 0;
      }
      out.flags[dest] = value;
      continue;
    }
    if (spec.kind != Kind::value || out.values.count(dest)) continue;
    if (env_it != env.end()) {
      if (auto st = check_type(spec, env_it->second); !st.ok()) return st;
      out.values[dest] = env_it->second;
    } else if (spec.default_value) {
      out.values[dest] = *spec.default_value;
    }
  }
  return {};
}

}  // namespace

Result<ParsedArgs> parse(const Table& table, const std::vector<std::string>& argv, const Environment& env) {
  ParsedArgs out;
  std::vector<std::string> unrecognized;
  bool end_of_options = false;
  bool saw_script = false;
  std::size_t i = 0;
  while (i < argv.size()) {
    const std::string& arg = argv[i];
    if (!end_of_options && arg == "--") {
      end_of_options = true;
      ++i;
      continue;
    }
    std::optional<Match> match;
    if (!end_of_options) {
      auto c = classify(table, arg);
      if (!c.ok()) return c.status();
      match = c.value();
    }
    if (!match) {  // the script: the rest of argv is its own
      saw_script = true;
      out.training_script = arg;
      out.training_script_args.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
      break;
    }
    ++i;
    if (match->spec == nullptr) {
      unrecognized.push_back(arg);
      continue;
    }
    if (auto st = take_option(table, argv, i, *match, out); !st.ok()) return st;
    if (out.help || out.version) return out;
  }

  if (!saw_script) {
    return invalid_argument("the following arguments are required: training_script, training_script_args");
  }
  if (!unrecognized.empty()) {
    std::string joined;
    for (const auto& u : unrecognized) joined += (joined.empty() ? "" : " ") + u;
    return invalid_argument("unrecognized arguments: " + joined);
  }
  if (auto st = apply_defaults(table, env, out); !st.ok()) return st;
  return out;
}

std::string usage(const Table& table, const std::string& prog) {
  std::string head = "usage: " + prog + " ";
  std::string indent(head.size(), ' ');
  std::vector<std::string> pieces;
  for (const auto& spec : table) {
    const std::string& first = spec.names.size() > 1 && spec.names[0].size() == 2 ? spec.names[0]
                                                                                 : spec.names[0];
    if (spec.kind == Kind::value) {
      std::string mv = spec.metavar();
      if (!spec.choices.empty()) {
        mv = "{";
        for (std::size_t k = 0; k < spec.choices.size(); ++k) mv += (k ? "," : "") + spec.choices[k];
        mv += "}";
      }
      pieces.push_back("[" + first + " " + mv + "]");
    } else {
      pieces.push_back("[" + first + "]");
    }
  }
  pieces.push_back("training_script ...");
  std::string out = head;
  std::size_t col = head.size();
  bool first_piece = true;
  for (const auto& p : pieces) {
    if (!first_piece && col + 1 + p.size() > 79) {
      out += "\n" + indent;
      col = indent.size();
    } else if (!first_piece) {
      out += " ";
      ++col;
    }
    out += p;
    col += p.size();
    first_piece = false;
  }
  return out + "\n";
}

std::string options_help(const Table& table) {
  std::string out;
  for (const auto& spec : table) {
    std::string names;
    for (const auto& n : spec.names) {
      names += (names.empty() ? "" : ", ") + n;
      if (spec.kind == Kind::value) names += " " + spec.metavar();
    }
    out += "  " + names + "\n                        " + spec.help + "\n";
  }
  return out;
}

}  // namespace muster::launcher::argparse
