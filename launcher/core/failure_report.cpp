#include "failure_report.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "signals.hpp"

namespace muster::launcher {
namespace {

std::string replace_newlines(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 16);
  for (char c : text) {
    out.push_back(c);
    if (c == '\n') out += "  ";
  }
  return out;
}

std::string format_time(long long unix_seconds) {
  time_t t = static_cast<time_t>(unix_seconds);
  tm local{};
  localtime_r(&t, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &local);
  return buf;
}

long long to_int(const nlohmann::json& v) {
  if (v.is_number_integer()) return v.get<long long>();
  if (v.is_number()) return static_cast<long long>(v.get<double>());
  if (v.is_string()) return std::stoll(v.get<std::string>());
  throw std::runtime_error("timestamp is neither a number nor a string");
}

}  // namespace

Result<ErrorFileContent> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return io_error("cannot open the error file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  ErrorFileContent out;
  out.raw_json = ss.str();
  try {
    auto data = nlohmann::json::parse(out.raw_json);
    const auto& message = data.at("message");
    if (message.is_string()) {
      out.traceback = message.get<std::string>();
      out.timestamp = data.contains("timestamp") ? to_int(data["timestamp"]) : 0;
    } else if (message.is_object()) {
      out.message_is_object = true;
      const nlohmann::json* extra = message.contains("extraInfo") ? &message["extraInfo"] : nullptr;
      if (extra != nullptr && extra->contains("py_callstack") && (*extra)["py_callstack"].is_string()) {
        out.traceback = (*extra)["py_callstack"].get<std::string>();
      } else if (message.contains("message") && message["message"].is_string()) {
        out.traceback = message["message"].get<std::string>();
      } else {
        out.traceback = "<N/A>";
      }
      out.timestamp = extra != nullptr && extra->contains("timestamp") ? to_int((*extra)["timestamp"]) : 0;
    } else {
      return invalid_argument("the error file " + path + " has a \"message\" that is neither a string nor an object");
    }
  } catch (const std::exception& e) {
    return invalid_argument("Failed to parse reply file: " + path + " (" + e.what() + ")");
  }
  return out;
}

ProcessFailure make_process_failure(int global_rank, int local_rank, pid_t pid, int exitcode,
                                    const std::string& error_file_path, long long now_unix,
                                    bool stopped_by_agent) {
  ProcessFailure f;
  f.global_rank = global_rank;
  f.local_rank = local_rank;
  f.pid = pid;
  f.exitcode = exitcode;
  f.stopped_by_agent = stopped_by_agent;
  f.timestamp = now_unix;
  bool have_file = !error_file_path.empty() && access(error_file_path.c_str(), F_OK) == 0;
  if (have_file) {
    auto content = read_error_file(error_file_path);
    f.error_file = error_file_path;
    if (content.ok()) {
      f.message = content->traceback;
      f.message_is_object = content->message_is_object;
      f.timestamp = content->timestamp;
      return f;
    }
    f.message = content.status().message();
    return f;
  }
  f.error_file = "<N/A>";
  if (exitcode < 0) {
    std::string name = signal_name(-exitcode);
    f.message = "Signal " + std::to_string(-exitcode) + " (" + (name.empty() ? "<N/A>" : name) +
                ") received by PID " + std::to_string(pid);
  } else {
    f.message = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
  }
  return f;
}

std::size_t root_cause_index(const std::vector<ProcessFailure>& failures) {
  std::size_t best = failures.size();
  for (std::size_t i = 0; i < failures.size(); ++i) {
    if (failures[i].stopped_by_agent) continue;
    if (best == failures.size() || failures[i].timestamp < failures[best].timestamp) best = i;
  }
  return best == failures.size() ? 0 : best;
}

std::string format_failure_report(const std::string& entrypoint_name, const std::vector<ProcessFailure>& failures,
                                  const std::string& host) {
  const std::string title = entrypoint_name + " FAILED";
  std::size_t width = title.size();
  std::size_t root = root_cause_index(failures);
  std::string root_block;
  std::vector<std::string> others;
  for (std::size_t idx = 0; idx < failures.size(); ++idx) {
    const auto& f = failures[idx];
    std::string block = "[" + std::to_string(idx) + "]:\n";
    block += "  time      : " + format_time(f.timestamp) + "\n";
    block += "  host      : " + (f.host.empty() ? host : f.host) + "\n";
    block += "  rank      : " + std::to_string(f.global_rank) + " (local_rank: " + std::to_string(f.local_rank) + ")\n";
    // torch 2.x appends the signal's name: "(pid: 7)  (SIGTERM)", and a lone space otherwise.
    std::string signal_suffix;
    if (f.exitcode < 0) {
      std::string name = signal_name(-f.exitcode);
      if (!name.empty()) signal_suffix = " (" + name + ")";
    }
    block += "  exitcode  : " + std::to_string(f.exitcode) + " (pid: " + std::to_string(f.pid) + ") " +
             signal_suffix + "\n";
    block += "  error_file: " + f.error_file + "\n";
    block += "  traceback : " + (f.message_is_object ? replace_newlines(f.message) : f.message);
    std::size_t start = 0;
    while (start <= block.size()) {
      std::size_t end = block.find('\n', start);
      std::size_t len = (end == std::string::npos ? block.size() : end) - start;
      width = std::max(width, len);
      if (end == std::string::npos) break;
      start = end + 1;
    }
    if (idx == root) root_block = block;
    else others.push_back(block);
  }
  width = std::min<std::size_t>(width, 60);
  std::string border(width, '=');
  std::string section(width, '-');
  std::string other_text;
  if (others.empty()) other_text = "  <NO_OTHER_FAILURES>";
  for (std::size_t i = 0; i < others.size(); ++i) other_text += (i ? "\n" : "") + others[i];
  return "\n" + border + "\n" + title + "\n" + section + "\nFailures:\n" + other_text + "\n" + section +
         "\nRoot Cause (first observed failure):\n" + root_block + "\n" + border;
}

std::string local_fqdn() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  std::string host = name;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return host;
  hostent entry{};
  hostent* result = nullptr;
  std::vector<char> buf(16384);
  int herr = 0;
  const void* addr = nullptr;
  socklen_t len = 0;
  int family = res->ai_family;
  if (family == AF_INET) {
    addr = &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    len = sizeof(in_addr);
  } else if (family == AF_INET6) {
    addr = &reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr;
    len = sizeof(in6_addr);
  }
  std::string out = host;
  if (addr != nullptr &&
      gethostbyaddr_r(addr, len, family, &entry, buf.data(), buf.size(), &result, &herr) == 0 && result) {
    std::vector<std::string> names{result->h_name};
    for (char** a = result->h_aliases; a && *a; ++a) names.emplace_back(*a);
    out = result->h_name;
    for (const auto& n : names) {
      if (n.find('.') != std::string::npos) {
        out = n;
        break;
      }
    }
  }
  freeaddrinfo(res);
  return out;
}

}  // namespace muster::launcher
