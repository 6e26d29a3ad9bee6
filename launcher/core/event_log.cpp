#include "event_log.hpp"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace muster::launcher {

using ojson = nlohmann::ordered_json;

namespace {

// Python's repr of a float: the fewest digits that read back as the same
// number, positional for exponents from -4 to 15 (with ".0" when integral),
// else d.ddde+XX.
std::string python_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  auto epos = s.find('e');
  int x = std::atoi(s.c_str() + epos + 1);
  std::string mantissa = s.substr(0, epos);
  bool negative = mantissa[0] == '-';
  std::string digits;
  for (char c : mantissa) {
    if (c >= '0' && c <= '9') digits += c;
  }
  std::string out;
  int last = static_cast<int>(digits.size()) - 1;
  if (x >= -4 && x < 16) {
    if (x >= last) out = digits + std::string(static_cast<std::size_t>(x - last), '0') + ".0";
    else if (x >= 0) out = digits.substr(0, static_cast<std::size_t>(x) + 1) + "." + digits.substr(static_cast<std::size_t>(x) + 1);
    else out = "0." + std::string(static_cast<std::size_t>(-x - 1), '0') + digits;
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", x < 0 ? '-' : '+', std::abs(x));
    out += e;
  }
  return negative ? "-" + out : out;
}

// A string as json.dumps writes one (ensure_ascii): ASCII as is but for the
// escapes JSON needs, every other character as \uXXXX (a surrogate pair above
// U+FFFF); a byte that is not UTF-8 as \udcXX, as Python's surrogateescape
// reads it from argv and the environment.
void python_string(const std::string& s, std::string& out) {
  auto hex4 = [&](unsigned v) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", v);
    out += buf;
  };
  out += '"';
  std::size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20 || c == 0x7f) {
            hex4(c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence (no overlong forms, no surrogates, at most U+10FFFF)?
    int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    unsigned cp = len == 4 ? c & 0x07 : len == 3 ? c & 0x0f : c & 0x1f;
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      ok = (cc & 0xc0) == 0x80;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (ok) {
      unsigned min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
      ok = cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (!ok) {
      hex4(0xdc00 + c);
      ++i;
      continue;
    }
    if (cp >= 0x10000) {
      cp -= 0x10000;
      hex4(0xd800 + (cp >> 10));
      hex4(0xdc00 + (cp & 0x3ff));
    } else {
      hex4(cp);
    }
    i += static_cast<std::size_t>(len);
  }
  out += '"';
}

void dump(const ojson& v, std::string& out) {
  switch (v.type()) {
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        python_string(it.key(), out);
        out += ": ";
        dump(it.value(), out);
      }
      out += '}';
      break;
    }
    case ojson::value_t::array: {
      out += '[';
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        dump(v[i], out);
      }
      out += ']';
      break;
    }
    case ojson::value_t::number_float:
      out += python_float(v.get<double>());
      break;
    case ojson::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case ojson::value_t::string:
      python_string(v.get_ref<const std::string&>(), out);
      break;
    default:  // integers, null
      out += v.dump(-1, ' ', true);
  }
}

}  // namespace

std::string python_json(const ojson& value) {
  std::string out;
  dump(value, out);
  return out;
}

std::string format_event(const std::string& state, const std::string& source, const EventJob& job,
                         const EventGroup& group, const EventWorker* worker,
                         const std::optional<std::string>& raw_error, const std::optional<double>& duration_ms) {
  auto optional_int = [](const std::optional<int>& v) { return v ? ojson(*v) : ojson(nullptr); };
  ojson md;
  md["group_world_size"] = optional_int(group.group_world_size);
  md["entry_point"] = job.entry_point;
  if (worker) {
    // torch writes these as one-element tuples.
    md["local_rank"] = ojson::array({worker->local_rank});
    md["role_rank"] = ojson::array({worker->role_rank});
    md["role_world_size"] = ojson::array({worker->role_world_size});
    md["exit_code"] = ojson::array({optional_int(worker->exit_code)});
    md["worker_pid"] = ojson::array({optional_int(worker->worker_pid)});
  }
  ojson metadata;
  metadata["run_id"] = job.run_id;
  metadata["global_rank"] = worker ? ojson(worker->global_rank) : ojson(nullptr);
  metadata["group_rank"] = optional_int(group.group_rank);
  metadata["worker_id"] = worker ? ojson(worker->worker_id) : ojson(nullptr);
  metadata["role"] = job.role;
  metadata["hostname"] = job.hostname;
  metadata["state"] = state;
  metadata["total_run_time"] = group.total_run_time;
  metadata["rdzv_backend"] = job.rdzv_backend;
  metadata["raw_error"] = raw_error ? ojson(*raw_error) : ojson(nullptr);
  metadata["metadata"] = python_json(md);
  metadata["agent_restarts"] = group.agent_restarts;
  metadata["duration_ms"] = duration_ms ? ojson(*duration_ms) : ojson(nullptr);
  ojson event;
  event["name"] = "torchelastic.worker.status." + state;
  event["source"] = source;
  event["timestamp"] = 0;
  event["metadata"] = std::move(metadata);
  return python_json(event);
}

std::string failure_raw_error(const std::string& error_file, int exit_code, bool& traits_added) {
  if (!error_file.empty()) {
    std::ifstream in(error_file);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      ojson data = ojson::parse(text.str(), nullptr, false);
      if (!data.is_discarded() && data.is_object()) return python_json(data);
    }
  }
  if (exit_code >= 0) traits_added = true;
  ojson data;
  data["message"] = "<NONE>";
  if (traits_added) {
    data["errorTraits"] = {{"category", "system_terminated_error"}, {"retryability", "False"}};
  }
  return python_json(data);
}

}  // namespace muster::launcher
