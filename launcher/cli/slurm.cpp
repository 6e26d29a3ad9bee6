#include "slurm.hpp"

#include <cctype>
#include <charconv>

namespace muster::launcher {

namespace {

std::optional<long long> to_number(std::string_view s) {
  long long v = 0;
  if (s.empty() || s.size() > 18) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

// "1-3,07" -> the numbers as text, padded as written.
Result<std::vector<std::string>> expand_ranges(std::string_view ranges, std::string_view whole, std::size_t max) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= ranges.size()) {
    std::size_t comma = ranges.find(',', start);
    std::string_view r = ranges.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    std::size_t dash = r.find('-');
    std::string_view lo_text = r.substr(0, dash);
    std::string_view hi_text = dash == std::string_view::npos ? lo_text : r.substr(dash + 1);
    auto lo = to_number(lo_text);
    auto hi = to_number(hi_text);
    if (!lo || !hi || *hi < *lo) {
      return invalid_argument("the hostlist '" + std::string(whole) + "' has a bad range '" + std::string(r) + "'");
    }
    if (static_cast<std::size_t>(*hi - *lo) >= max || out.size() + static_cast<std::size_t>(*hi - *lo) + 1 > max) {
      return invalid_argument("the hostlist '" + std::string(whole) + "' names more than " + std::to_string(max) +
                              " hosts");
    }
    std::size_t width = lo_text.size();
    for (long long v = *lo; v <= *hi; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      out.push_back(std::move(digits));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view list, std::size_t max_hosts) {
  std::vector<std::string> hosts;
  // Split at the commas outside brackets.
  std::vector<std::string_view> items;
  int depth = 0;
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (++depth > 1) return invalid_argument("the hostlist '" + std::string(list) + "' nests brackets");
    } else if (c == ']') {
      if (--depth < 0) return invalid_argument("the hostlist '" + std::string(list) + "' has an unmatched ']'");
    } else if (c == ',' && depth == 0) {
      if (i > begin) items.push_back(list.substr(begin, i - begin));
      begin = i + 1;
    } else if (std::isspace(static_cast<unsigned char>(c)) || c == '\0') {
      return invalid_argument("the hostlist '" + std::string(list) + "' has a blank or control character");
    }
  }
  if (depth != 0) return invalid_argument("the hostlist '" + std::string(list) + "' has an unmatched '['");
  for (auto item : items) {
    // Multiply out each bracket group, left to right.
    std::vector<std::string> names{""};
    std::size_t pos = 0;
    while (pos < item.size()) {
      std::size_t open = item.find('[', pos);
      std::string_view text = item.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos);
      for (auto& n : names) n += text;
      if (open == std::string_view::npos) break;
      std::size_t close = item.find(']', open);
      auto numbers = expand_ranges(item.substr(open + 1, close - open - 1), list, max_hosts);
      if (!numbers.ok()) return numbers.status();
      if (names.size() * numbers->size() > max_hosts) {
        return invalid_argument("the hostlist '" + std::string(list) + "' names more than " +
                                std::to_string(max_hosts) + " hosts");
      }
      std::vector<std::string> next;
      next.reserve(names.size() * numbers->size());
      for (const auto& n : names) {
        for (const auto& d : *numbers) next.push_back(n + d);
      }
      names = std::move(next);
      pos = close + 1;
    }
    if (hosts.size() + names.size() > max_hosts) {
      return invalid_argument("the hostlist '" + std::string(list) + "' names more than " + std::to_string(max_hosts) +
                              " hosts");
    }
    for (auto& n : names) hosts.push_back(std::move(n));
  }
  if (hosts.empty()) return invalid_argument("the hostlist '" + std::string(list) + "' names no host");
  return hosts;
}

int slurm_port(const std::string& job_id, const std::string& step_id) {
  auto job = to_number(job_id).value_or(0);
  auto step = to_number(step_id).value_or(0);
  return 20000 + static_cast<int>((job % 12768 * 16 + step % 16) % 12768);
}

Result<std::optional<SlurmStep>> read_slurm_step(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
  auto job = get("SLURM_JOB_ID");
  auto nodes_text = get("SLURM_STEP_NUM_NODES");
  if (!job || !nodes_text) return std::optional<SlurmStep>();
  auto bad = [](const std::string& what) {
    return Status(Code::invalid_argument, "inside a Slurm step, " + what +
                                              "; run muster with srun (one task per node: srun --ntasks-per-node=1), "
                                              "or give --nnodes and a rendezvous to set the job up yourself");
  };
  SlurmStep s;
  s.job_id = *job;
  s.step_id = get("SLURM_STEP_ID").value_or("0");
  auto nodes = to_number(*nodes_text);
  if (!nodes || *nodes < 1 || *nodes > 1000000) {
    return bad("SLURM_STEP_NUM_NODES='" + *nodes_text + "' is not a node count");
  }
  s.nodes = static_cast<int>(*nodes);
  auto node_id_text = get("SLURM_NODEID");
  auto node_id = node_id_text ? to_number(*node_id_text) : std::nullopt;
  if (!node_id || *node_id >= *nodes) {
    return bad("SLURM_NODEID='" + node_id_text.value_or("") + "' is not a node of the step's " + *nodes_text);
  }
  s.node_id = static_cast<int>(*node_id);
  if (auto tasks = get("SLURM_STEP_NUM_TASKS")) {
    auto t = to_number(*tasks);
    if (!t || *t > 100000000) return bad("SLURM_STEP_NUM_TASKS='" + *tasks + "' is not a task count");
    s.tasks = static_cast<int>(*t);
    // One muster per node: more tasks would start several agents per node, each
    // claiming the same node rank.
    if (s.tasks > s.nodes) {
      return bad("the step runs " + *tasks + " tasks on " + *nodes_text +
                 " node(s), so several muster agents would share a node rank");
    }
  }
  auto list = get("SLURM_STEP_NODELIST");
  if (!list) list = get("SLURM_JOB_NODELIST");
  if (!list) return bad("neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST names the step's hosts");
  // The first host only: its first name, every bracket group at its first number.
  std::string first;
  int depth = 0;
  for (std::size_t i = 0; i < list->size(); ++i) {
    char c = (*list)[i];
    if (c == ',' && depth == 0) break;
    if (c == '[') {
      ++depth;
      first += c;
      std::size_t end = list->find_first_of(",]", i + 1);
      if (end == std::string::npos) break;  // malformed: expand_hostlist says how
      std::string range = list->substr(i + 1, end - i - 1);
      first += range.substr(0, range.find('-'));
      i = list->find(']', i);
      if (i == std::string::npos) break;
      first += ']';
      --depth;
      continue;
    }
    first += c;
  }
  auto hosts = expand_hostlist(first, 1);
  if (!hosts.ok()) return bad(hosts.status().message());
  s.head = hosts->front();
  if (auto gpus = get("SLURM_GPUS_ON_NODE")) {
    if (auto g = to_number(*gpus); g && *g <= 4096) s.gpus_on_node = static_cast<int>(*g);
  }
  s.port = slurm_port(s.job_id, s.step_id);
  return std::optional<SlurmStep>(std::move(s));
}

}  // namespace muster::launcher
