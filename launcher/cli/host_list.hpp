// The hosts of a launch over ssh (muster --hostfile / --hosts), and the
// DeepSpeed-style --include / --exclude that pick among them (pure).
//
// A host file holds one host a line, `host [slots=N]`, as DeepSpeed's and
// Open MPI's do; `#` starts a comment, blank lines are skipped, Open MPI's
// `max_slots=N` is accepted and ignored. A host is a name or address, with an
// optional `user@`, an IPv6 address in brackets. --hosts gives the same list
// on the command line: `h1[:slots],h2[:slots],[::1]:4`.
//
// --include / --exclude take DeepSpeed's syntax: host specs joined by `@`,
// each `host` (the whole host) or `host:0,2` (those slots of it). Include keeps
// only what it names; exclude takes away what it names. A host left with
// chosen slots runs one worker per slot, CUDA_VISIBLE_DEVICES naming them.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher {

// The most hosts one launch takes, and the most slots of one host.
constexpr std::size_t kMaxLaunchHosts = 4096;
constexpr int kMaxSlotsPerHost = 1024;
// The longest line of a host file, and the biggest file.
constexpr std::size_t kMaxHostFileLine = 4096;
constexpr std::size_t kMaxHostFileBytes = 4 * 1024 * 1024;

struct HostEntry {
  std::string name;                 // as written (brackets kept): the label of its output
  std::string target;               // what ssh is given: user@host, brackets removed
  std::optional<int> slots;         // slots=N, when given
  std::optional<std::vector<int>> chosen_slots;  // --include/--exclude picked these
  std::string where;                // "file:line" or "--hosts"
};

// Parses a host file's text; `path` names it in errors ("path:line: why").
Result<std::vector<HostEntry>> parse_host_file(std::string_view text, const std::string& path);
// Reads and parses the file at `path` (refusing a missing, unreadable or too big one).
Result<std::vector<HostEntry>> read_host_file(const std::string& path);
// Parses --hosts's value.
Result<std::vector<HostEntry>> parse_hosts_option(std::string_view text);
// Applies --include or --exclude ("" for none; both at once is refused).
// `default_slots`: the slots of a host whose line gives none (--nproc-per-node
// when it is a number), to check and complete a slot choice.
Result<std::vector<HostEntry>> select_hosts(std::vector<HostEntry> hosts, std::string_view include,
                                            std::string_view exclude, std::optional<int> default_slots);

}  // namespace muster::launcher
