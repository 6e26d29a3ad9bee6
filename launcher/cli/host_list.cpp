#include "host_list.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace muster::launcher {
namespace {

Status bad(const std::string& where, const std::string& why) {
  return Status(Code::invalid_argument, where + ": " + why);
}

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A host as written: [user@](name | [ipv6]). Fills name, target.
Status parse_host_token(std::string_view token, const std::string& where, HostEntry& out) {
  std::string_view host = token;
  std::string user;
  if (auto at = token.find('@'); at != std::string_view::npos) {
    user = std::string(token.substr(0, at));
    host = token.substr(at + 1);
    if (user.empty() || user.front() == '-' || !std::all_of(user.begin(), user.end(), name_char)) {
      return bad(where, "'" + std::string(token) + "' has a bad user name before '@'");
    }
  }
  std::string address;
  if (!host.empty() && host.front() == '[') {
    if (host.back() != ']' || host.size() < 3) {
      return bad(where, "'" + std::string(token) + "': an IPv6 address goes in brackets, as [fe80::1]");
    }
    address = std::string(host.substr(1, host.size() - 2));
    bool ok = address.find(':') != std::string::npos && address.front() != '-' &&
              std::all_of(address.begin(), address.end(), [](char c) {
                return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.' || c == '%' ||
                       name_char(c);
              });
    if (!ok) return bad(where, "'" + std::string(token) + "' is not an IPv6 address in brackets");
  } else {
    if (host.empty()) return bad(where, "a host name is missing");
    if (host.find(':') != std::string_view::npos) {
      return bad(where, "'" + std::string(token) + "': put an IPv6 address in brackets, as [" + std::string(host) +
                            "]");
    }
    if (host.front() == '-' || host.front() == '.' || !std::all_of(host.begin(), host.end(), name_char)) {
      return bad(where, "'" + std::string(token) +
                            "' is not a host name (letters, digits, '.', '-', '_'; not starting with '-')");
    }
    address = std::string(host);
  }
  out.name = std::string(token);
  out.target = user.empty() ? address : user + "@" + address;
  out.where = where;
  return {};
}

Result<int> parse_count(std::string_view text, const std::string& where, const std::string& what, int low, int high) {
  if (text.empty() || text.size() > 9 || !std::all_of(text.begin(), text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    return bad(where, what + " '" + std::string(text) + "' is not a number");
  }
  int v = std::stoi(std::string(text));
  if (v < low || v > high) {
    return bad(where, what + " " + std::to_string(v) + " is out of range (" + std::to_string(low) + " to " +
                          std::to_string(high) + ")");
  }
  return v;
}

// The host part of a name (no user@), what --include/--exclude match.
std::string host_part(const HostEntry& e) {
  auto at = e.name.find('@');
  return at == std::string::npos ? e.name : e.name.substr(at + 1);
}

Status check_unique(const std::vector<HostEntry>& hosts) {
  std::map<std::string, std::string> seen;
  for (const auto& h : hosts) {
    auto [it, fresh] = seen.emplace(h.target, h.where);
    if (!fresh) return bad(h.where, "host " + h.name + " is already listed (" + it->second + ")");
  }
  return {};
}

// One --include/--exclude spec: host, or host:slot[,slot...].
struct SlotSpec {
  std::string host;
  std::optional<std::set<int>> slots;
};

Result<std::vector<SlotSpec>> parse_selection(std::string_view text, const std::string& option) {
  std::vector<SlotSpec> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t at = text.find('@', pos);
    std::string_view item = trim(text.substr(pos, at == std::string_view::npos ? std::string_view::npos : at - pos));
    if (item.empty()) return bad(option, "an empty host in '" + std::string(text) + "' (hosts are joined by '@')");
    SlotSpec spec;
    std::string_view host = item;
    std::string_view slots;
    if (item.front() == '[') {
      auto close = item.find(']');
      if (close == std::string_view::npos) return bad(option, "'" + std::string(item) + "' lacks its ']'");
      host = item.substr(0, close + 1);
      if (close + 1 < item.size()) {
        if (item[close + 1] != ':') return bad(option, "'" + std::string(item) + "': expected ':' after ']'");
        slots = item.substr(close + 2);
        spec.slots.emplace();
      }
    } else if (auto colon = item.find(':'); colon != std::string_view::npos) {
      host = item.substr(0, colon);
      slots = item.substr(colon + 1);
      spec.slots.emplace();
    }
    spec.host = std::string(host);
    if (spec.slots) {
      std::size_t p = 0;
      while (p <= slots.size()) {
        std::size_t comma = slots.find(',', p);
        auto one = trim(slots.substr(p, comma == std::string_view::npos ? std::string_view::npos : comma - p));
        auto n = parse_count(one, option, "slot", 0, kMaxSlotsPerHost - 1);
        if (!n.ok()) return n.status();
        spec.slots->insert(*n);
        if (comma == std::string_view::npos) break;
        p = comma + 1;
      }
    }
    out.push_back(std::move(spec));
    if (at == std::string_view::npos) break;
    pos = at + 1;
  }
  return out;
}

}  // namespace

Result<std::vector<HostEntry>> parse_host_file(std::string_view text, const std::string& path) {
  std::vector<HostEntry> hosts;
  std::size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    const std::string where = path + ":" + std::to_string(line_no);
    if (line.size() > kMaxHostFileLine) return bad(where, "the line is longer than " + std::to_string(kMaxHostFileLine) + " bytes");
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    std::vector<std::string> words;
    std::istringstream in{std::string(line)};
    for (std::string w; in >> w;) words.push_back(w);
    HostEntry e;
    if (auto st = parse_host_token(words[0], where, e); !st.ok()) return st;
    for (std::size_t i = 1; i < words.size(); ++i) {
      const std::string& w = words[i];
      auto eq = w.find('=');
      std::string key = w.substr(0, eq);
      if (eq == std::string::npos) {
        return bad(where, "'" + w + "' is not a field; a line is: host [slots=N]");
      }
      if (key == "slots") {
        if (e.slots) return bad(where, "slots is given twice");
        auto n = parse_count(std::string_view(w).substr(eq + 1), where, "slots", 1, kMaxSlotsPerHost);
        if (!n.ok()) return n.status();
        e.slots = *n;
      } else if (key == "max_slots" || key == "max-slots") {
        auto n = parse_count(std::string_view(w).substr(eq + 1), where, key, 1, 1 << 20);
        if (!n.ok()) return n.status();
      } else {
        return bad(where, "unknown field '" + key + "'; a line is: host [slots=N]");
      }
    }
    hosts.push_back(std::move(e));
    if (hosts.size() > kMaxLaunchHosts) return bad(where, "more than " + std::to_string(kMaxLaunchHosts) + " hosts");
  }
  if (hosts.empty()) return bad(path, "no host in the file (one host a line: host [slots=N])");
  if (auto st = check_unique(hosts); !st.ok()) return st;
  return hosts;
}

Result<std::vector<HostEntry>> read_host_file(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) return Status(Code::invalid_argument, "--hostfile " + path + ": no such file");
  if (!S_ISREG(st.st_mode)) return Status(Code::invalid_argument, "--hostfile " + path + ": not a regular file");
  if (static_cast<std::size_t>(st.st_size) > kMaxHostFileBytes) {
    return Status(Code::invalid_argument, "--hostfile " + path + ": bigger than " +
                                              std::to_string(kMaxHostFileBytes / (1024 * 1024)) + " MiB");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(Code::invalid_argument, "--hostfile " + path + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_host_file(text.str(), path);
}

Result<std::vector<HostEntry>> parse_hosts_option(std::string_view text) {
  std::vector<HostEntry> hosts;
  const std::string where = "--hosts";
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    std::string_view item = trim(text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos));
    if (item.empty()) return bad(where, "an empty host in '" + std::string(text) + "'");
    std::string_view host = item;
    std::string_view slots;
    bool has_slots = false;
    std::size_t end = std::string_view::npos;
    if (auto lb = item.find('['); lb != std::string_view::npos) {
      auto rb = item.find(']', lb);
      if (rb == std::string_view::npos) return bad(where, "'" + std::string(item) + "' lacks its ']'");
      end = rb + 1;
    } else {
      end = item.find(':');
    }
    if (end != std::string_view::npos && end < item.size()) {
      if (item[end] != ':') return bad(where, "'" + std::string(item) + "': expected ':' after ']'");
      host = item.substr(0, end);
      slots = item.substr(end + 1);
      has_slots = true;
    }
    HostEntry e;
    if (auto st = parse_host_token(host, where, e); !st.ok()) return st;
    if (has_slots) {
      auto n = parse_count(slots, where + " " + std::string(item), "slots", 1, kMaxSlotsPerHost);
      if (!n.ok()) return n.status();
      e.slots = *n;
    }
    hosts.push_back(std::move(e));
    if (hosts.size() > kMaxLaunchHosts) return bad(where, "more than " + std::to_string(kMaxLaunchHosts) + " hosts");
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  if (auto st = check_unique(hosts); !st.ok()) return st;
  return hosts;
}

Result<std::vector<HostEntry>> select_hosts(std::vector<HostEntry> hosts, std::string_view include,
                                            std::string_view exclude, std::optional<int> default_slots) {
  if (!include.empty() && !exclude.empty()) {
    return Status(Code::invalid_argument, "--include and --exclude cannot be given together");
  }
  if (include.empty() && exclude.empty()) return hosts;
  const bool including = !include.empty();
  const std::string option = including ? "--include" : "--exclude";
  auto specs = parse_selection(including ? include : exclude, option);
  if (!specs.ok()) return specs.status();
  std::map<std::string, const SlotSpec*> by_host;
  for (const auto& s : *specs) {
    auto matches = std::count_if(hosts.begin(), hosts.end(), [&](const HostEntry& h) { return host_part(h) == s.host; });
    if (matches == 0) return bad(option, "host " + s.host + " is not among the hosts given");
    if (!by_host.emplace(s.host, &s).second) return bad(option, "host " + s.host + " is named twice");
    // Every entry of that host (user@host lines) is checked.
    for (auto it = hosts.begin(); s.slots && it != hosts.end(); ++it) {
      if (host_part(*it) != s.host) continue;
      std::optional<int> slots = it->slots ? it->slots : default_slots;
      if (!slots) {
        return bad(option, "host " + s.host +
                               " has no slot count to choose from: give it slots=N in the host file, or a number "
                               "to --nproc-per-node");
      }
      for (int id : *s.slots) {
        if (id >= *slots) {
          return bad(option, "host " + s.host + " has " + std::to_string(*slots) + " slots (0 to " +
                                 std::to_string(*slots - 1) + "), not slot " + std::to_string(id));
        }
      }
    }
  }
  std::vector<HostEntry> out;
  for (auto& h : hosts) {
    auto it = by_host.find(host_part(h));
    const SlotSpec* spec = it == by_host.end() ? nullptr : it->second;
    if (including) {
      if (!spec) continue;
      if (spec->slots) h.chosen_slots = std::vector<int>(spec->slots->begin(), spec->slots->end());
    } else if (spec) {
      if (!spec->slots) continue;
      int slots = h.slots ? *h.slots : *default_slots;
      std::vector<int> left;
      for (int i = 0; i < slots; ++i) {
        if (!spec->slots->count(i)) left.push_back(i);
      }
      if (left.empty()) continue;
      h.chosen_slots = std::move(left);
    }
    out.push_back(std::move(h));
  }
  if (out.empty()) return bad(option, "no host is left to run on");
  return out;
}

}  // namespace muster::launcher
