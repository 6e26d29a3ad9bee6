#include "progress_watch.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace muster::launcher {

void ProgressWatch::start(int nproc, Clock::time_point now) {
  last_.assign(static_cast<std::size_t>(std::max(nproc, 0)), now);
  held_.assign(last_.size(), 0);
}

void ProgressWatch::progress_all(Clock::time_point now) {
  for (std::size_t i = 0; i < last_.size(); ++i) progress(static_cast<int>(i), now);
}

void ProgressWatch::hold(int local_rank, bool held, Clock::time_point now) {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= held_.size()) return;
  auto& h = held_[static_cast<std::size_t>(local_rank)];
  h = std::max(0, h + (held ? 1 : -1));
  progress(local_rank, now);
}

void ProgressWatch::progress(int local_rank, Clock::time_point now) {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= last_.size()) return;
  auto& t = last_[static_cast<std::size_t>(local_rank)];
  if (t && now > *t) t = now;
}

void ProgressWatch::stop(int local_rank) {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= last_.size()) return;
  last_[static_cast<std::size_t>(local_rank)].reset();
}

std::vector<ProgressWatch::Silent> ProgressWatch::silent(Clock::time_point now) const {
  std::vector<Silent> out;
  for (std::size_t i = 0; i < last_.size(); ++i) {
    if (!last_[i] || held_[i] > 0) continue;
    auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - *last_[i]);
    if (quiet >= timeout_) out.push_back({static_cast<int>(i), quiet});
  }
  return out;
}

std::chrono::milliseconds ProgressWatch::check_interval() const {
  return std::clamp(timeout_ / 10, kMinProgressCheck, kMaxProgressCheck);
}


namespace {

std::optional<unsigned long long> parse_number(std::string_view s, int base) {
  unsigned long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// "0100007F:1F90" or the IPv6 form: the port is the hex after the last ':'.
std::optional<int> port_of(std::string_view address) {
  auto colon = address.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto port = parse_number(address.substr(colon + 1), 16);
  if (!port || *port > 65535) return std::nullopt;
  return static_cast<int>(*port);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::vector<TcpRow> parse_proc_net_tcp(std::string_view text) {
  std::vector<TcpRow> rows;
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto end = text.find('\n', pos);
    std::string_view line = text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    pos = end == std::string_view::npos ? text.size() : end + 1;
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
    std::vector<std::string_view> fields;
    std::size_t i = 0;
    while (i < line.size() && fields.size() < 10) {
      while (i < line.size() && line[i] == ' ') ++i;
      std::size_t j = i;
      while (j < line.size() && line[j] != ' ') ++j;
      if (j > i) fields.push_back(line.substr(i, j - i));
      i = j;
    }
    if (fields.size() < 10 || fields[0].empty() || fields[0].back() != ':') continue;  // the header, or junk
    auto local = port_of(fields[1]);
    auto remote = port_of(fields[2]);
    auto inode = parse_number(fields[9], 10);
    if (!local || !remote || !inode || *inode == 0) continue;
    rows.push_back({*local, *remote, *inode});
  }
  return rows;
}

std::map<int, int> local_socket_owners(const std::vector<int>& local_ports, int remote_port,
                                       const std::vector<std::pair<int, pid_t>>& candidates,
                                       const std::string& proc_root) {
  std::map<int, int> owners;
  std::map<unsigned long long, int> port_of_inode;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    for (const auto& row : parse_proc_net_tcp(read_all(proc_root + table))) {
      if (row.remote_port == remote_port &&
          std::find(local_ports.begin(), local_ports.end(), row.local_port) != local_ports.end()) {
        port_of_inode[row.inode] = row.local_port;
      }
    }
  }
  if (port_of_inode.empty()) return owners;
  for (const auto& [local_rank, pid] : candidates) {
    if (pid <= 0) continue;
    std::string dir = proc_root + "/" + std::to_string(pid) + "/fd";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) continue;
    // Bounded by the process's descriptors; a worker holds few.
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char link[64];
      ssize_t n = ::readlinkat(::dirfd(d), e->d_name, link, sizeof link - 1);
      if (n <= 0) continue;
      std::string_view target(link, static_cast<std::size_t>(n));
      constexpr std::string_view kSocket = "socket:[";
      if (target.substr(0, kSocket.size()) != kSocket || target.back() != ']') continue;
      auto inode = parse_number(target.substr(kSocket.size(), target.size() - kSocket.size() - 1), 10);
      if (!inode) continue;
      if (auto it = port_of_inode.find(*inode); it != port_of_inode.end()) owners[it->second] = local_rank;
    }
    ::closedir(d);
  }
  return owners;
}

}  // namespace muster::launcher
