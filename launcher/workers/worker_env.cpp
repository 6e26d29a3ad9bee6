#include "worker_env.hpp"

#include <cctype>

namespace muster::launcher {
namespace {

std::string strip(const std::string& s) {
  std::size_t b = 0;
  std::size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

Result<Environment> build_worker_env(const Environment& base, const GroupAssignment& g, int local_rank,
                                     const std::string& error_file, bool virtual_local_rank) {
  Environment env = base;
  auto set = [&](const char* key, std::string value) { env[key] = std::move(value); };
  set("LOCAL_RANK", std::to_string(virtual_local_rank ? 0 : local_rank));
  set("RANK", std::to_string(g.base_global_rank + local_rank));
  set("GROUP_RANK", std::to_string(g.group_rank));
  set("ROLE_RANK", std::to_string(g.base_role_rank + local_rank));
  set("ROLE_NAME", g.role);
  set("LOCAL_WORLD_SIZE", std::to_string(g.local_world_size));
  set("WORLD_SIZE", std::to_string(g.global_world_size));
  set("GROUP_WORLD_SIZE", std::to_string(g.group_world_size));
  set("ROLE_WORLD_SIZE", std::to_string(g.role_world_size));
  set("MASTER_ADDR", g.master_addr);
  set("MASTER_PORT", std::to_string(g.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(g.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(g.max_restarts));
  set("TORCHELASTIC_RUN_ID", g.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", g.use_agent_store ? "True" : "False");
  auto nccl = base.find("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  set("TORCH_NCCL_ASYNC_ERROR_HANDLING", nccl == base.end() ? "1" : nccl->second);
  set("TORCHELASTIC_ERROR_FILE", error_file);

  if (virtual_local_rank) {
    auto cvd = base.find("CUDA_VISIBLE_DEVICES");
    if (cvd == base.end()) {
      set("CUDA_VISIBLE_DEVICES", std::to_string(local_rank));
    } else {
      std::vector<std::string> items;
      std::size_t pos = 0;
      const std::string& v = cvd->second;
      while (true) {
        std::size_t comma = v.find(',', pos);
        items.push_back(strip(v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos)));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      if (local_rank >= static_cast<int>(items.size())) {
        return invalid_argument("local_rank " + std::to_string(local_rank) +
                                " exceeds available GPUs in CUDA_VISIBLE_DEVICES=" + v +
                                "; list at least --nproc-per-node devices there");
      }
      set("CUDA_VISIBLE_DEVICES", items[static_cast<std::size_t>(local_rank)]);
    }
  }
  return env;
}

std::vector<std::string> to_envp(const Environment& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::string env_or(const Environment& env, const std::string& key, const std::string& fallback) {
  auto it = env.find(key);
  return it == env.end() ? fallback : it->second;
}

}  // namespace muster::launcher
