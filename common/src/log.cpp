#include "muster/common/log.hpp"

#include "muster/common/fd_io.hpp"

#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

namespace muster::log {
namespace {

struct Sink {
  Level level = Level::warning;
  std::string component = "muster";
  Writer writer;
};

Sink& sink() {
  static Sink s;
  return s;
}

char level_letter(Level level) {
  switch (level) {
    case Level::debug: return 'V';  // glog's VERBOSE, as torch's formatter writes DEBUG
    case Level::info: return 'I';
    case Level::warning: return 'W';
    case Level::error: return 'E';
  }
  return '?';
}

}  // namespace

void init_from_env(std::string_view component) {
  sink().component = std::string(component);
  const char* env = std::getenv("LOGLEVEL");
  if (env == nullptr) return;
  std::string value(env);
  for (auto& c : value) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (value == "DEBUG") set_level(Level::debug);
  else if (value == "INFO") set_level(Level::info);
  else if (value == "WARNING" || value == "WARN") set_level(Level::warning);
  else if (value == "ERROR" || value == "CRITICAL") set_level(Level::error);
}

void set_level(Level level) { sink().level = level; }

void set_writer(Writer writer) { sink().writer = std::move(writer); }

bool enabled(Level level) { return static_cast<int>(level) >= static_cast<int>(sink().level); }

void write(Level level, std::string_view message) {
  if (!enabled(level)) return;
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm local{};
  localtime_r(&tv.tv_sec, &local);
  char prefix[96];
  // torch's log formatter: glog's layout with millisecond precision written as
  // six digits (Python's record.msecs * 1000), e.g. W1204 15:32:38.050000.
  int n = std::snprintf(prefix, sizeof prefix, "%c%02d%02d %02d:%02d:%02d.%06ld %d %s] ",
                        level_letter(level), local.tm_mon + 1, local.tm_mday, local.tm_hour,
                        local.tm_min, local.tm_sec, static_cast<long>(tv.tv_usec / 1000 * 1000),
                        static_cast<int>(getpid()), sink().component.c_str());
  std::string out;
  out.reserve(message.size() + 64);
  std::size_t start = 0;
  while (true) {
    std::size_t end = message.find('\n', start);
    out.append(prefix, static_cast<std::size_t>(n));
    out.append(message.substr(start, end == std::string_view::npos ? end : end - start));
    out.push_back('\n');
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  if (sink().writer) return sink().writer(out);
  // One write per message so concurrent writers never split it.
  write_fully(STDERR_FILENO, out.data(), out.size());
}

}  // namespace muster::log
