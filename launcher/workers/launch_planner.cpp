#include "launch_planner.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "macros.hpp"
#include "muster/common/log.hpp"
#include "muster/net/unique_fd.hpp"

namespace muster::launcher {

LaunchPlanner::LaunchPlanner(const LaunchConfig& cfg, AsyncWriter& writer, ConsoleSinks console)
    : cfg_(cfg), writer_(writer), console_(console), executable_path_(cfg.executable) {}

LaunchPlanner::~LaunchPlanner() { finish(); }

Status LaunchPlanner::resolve_executable(const Environment& env) {
  auto path = launcher::resolve_executable(cfg_.executable, env_or(env, "PATH", ""));
  if (!path.ok()) return path.status();
  executable_path_ = path.value();
  return {};
}

Result<std::string> LaunchPlanner::prepare_attempt(int restart_count, const Environment& env) {
  if (!logs_) {
    auto logs = LogDirectory::create(cfg_.log_dir, cfg_.rdzv_id, env_or(env, "TMPDIR", "/tmp"));
    if (!logs.ok()) return logs.status();
    logs_ = std::move(logs.value());
    if (!logs_->disabled()) log::info("log directory set to: " + logs_->run_dir());
  }
  auto attempt = logs_->prepare_attempt(restart_count, cfg_.nproc_per_node);
  if (!attempt.ok()) return attempt.status();
  open_filtered_logs(attempt.value());
  prepare_run_path_barrier(env);
  return attempt.value();
}

void LaunchPlanner::finish() {
  remove_run_path_barrier();
  close_filtered_logs();
}

Result<std::vector<LaunchPlanner::Worker>> LaunchPlanner::launches(const Environment& agent_env,
                                                                 const GroupAssignment& group,
                                                                 const std::string& attempt_dir,
                                                                 WorkerTimeout* timeout) {
  Environment env_ = agent_env;
  if (cfg_.run_path) {
    // Only this attempt's folder, never one the agent's own environment carried in.
    env_.erase("MUSTER_RUN_PATH_DONE_DIR");
    env_.erase("MUSTER_RUN_PATH_WORKERS");
  }
  for (const auto& [k, v] : extra_env_) env_[k] = v;
  std::vector<Worker> launches;
  for (int lr = 0; lr < cfg_.nproc_per_node; ++lr) {
    WorkerLaunch w;
    w.local_rank = lr;
    w.path = executable_path_;
    w.argv.push_back(cfg_.executable);
    for (const auto& a : cfg_.args) w.argv.push_back(substitute_local_rank(a, lr));

    std::string rank_dir = logs_->disabled() ? std::string() : logs_->rank_dir(attempt_dir, lr);
    std::string error_file = rank_dir.empty() ? std::string() : rank_dir + "/error.json";
    auto env = build_worker_env(env_, group, lr, error_file, cfg_.virtual_local_rank);
    if (!env.ok()) return env.status();
    w.envp = to_envp(env.value());
    if (lr < static_cast<int>(cfg_.worker_cpus.size())) w.cpu_mask = numa::to_mask(cfg_.worker_cpus[lr]);

    bool shown = !cfg_.local_ranks_filter || cfg_.local_ranks_filter->count(lr) > 0;
    std::string prefix = "[" + cfg_.role + std::to_string(lr) + "]:";
    if (auto tmpl = env_.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); tmpl != env_.end()) {
      prefix = safe_substitute(tmpl->second, {{"role_name", cfg_.role},
                                              {"rank", std::to_string(group.base_global_rank + lr)},
                                              {"local_rank", std::to_string(lr)}});
    }
    auto plan = [&](unsigned bit, const char* file, AsyncWriter::Sink console, AsyncWriter::Sink filtered,
                    const std::vector<std::string>& filters) {
      StreamPlan p;
      bool tee = (cfg_.tee.for_rank(lr) & bit) != 0;
      bool redirect = (cfg_.redirects.for_rank(lr) & bit) != 0;
      std::string path = rank_dir.empty() ? std::string() : rank_dir + "/" + file;
      if (tee && shown) {
        p.mode = StreamPlan::Mode::tee;
        p.path = path;
        p.tee.writer = &writer_;
        p.tee.console = console;
        p.tee.prefix = prefix;
        p.tee.filtered = filtered;
        p.tee.filters = filters;
      } else if (tee || redirect) {
        p.mode = path.empty() ? StreamPlan::Mode::devnull : StreamPlan::Mode::file;
        p.path = path;
      } else {
        p.mode = shown ? StreamPlan::Mode::inherit : StreamPlan::Mode::devnull;
      }
      if (timeout) {
        // Every byte is progress: the stream goes through a pump that sees it,
        // on to where it would have gone (unchanged where it was inherited).
        if (p.mode != StreamPlan::Mode::tee) {
          p.tee = PumpTargets{};
          p.tee.writer = &writer_;
          if (p.mode == StreamPlan::Mode::inherit) p.tee.console = console;
          p.tee.raw_console = true;
          if (p.mode == StreamPlan::Mode::devnull) p.path.clear();
          p.mode = StreamPlan::Mode::tee;
        }
        p.tee.on_activity = timeout->output_of(lr);
        p.tee.on_blocked = timeout->blocked_of(lr);
      }
      return p;
    };
    w.out = plan(kStdOut, "stdout.log", console_.out, filtered_stdout_, cfg_.duplicate_stdout_filters);
    w.err = plan(kStdErr, "stderr.log", console_.err, filtered_stderr_, cfg_.duplicate_stderr_filters);
    launches.push_back(Worker{std::move(w), error_file});
  }
  return launches;
}

void LaunchPlanner::close_filtered_logs() {
  for (AsyncWriter::Sink* sink : {&filtered_stdout_, &filtered_stderr_}) {
    if (*sink) writer_.release(*sink);  // closed once written
    *sink = {};
  }
}

void LaunchPlanner::open_filtered_logs(const std::string& attempt_dir) {
  close_filtered_logs();
  if (attempt_dir.empty()) return;
  auto open_log = [&](const std::vector<std::string>& filters, const char* name) {
    if (filters.empty()) return AsyncWriter::Sink{};
    std::string path = attempt_dir + "/" + name;
    net::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!fd) {
      log::warning("cannot create " + path + ": " + std::strerror(errno));
      return AsyncWriter::Sink{};
    }
    return writer_.add_owned(std::move(fd), path);
  };
  filtered_stdout_ = open_log(cfg_.duplicate_stdout_filters, "filtered_stdout.log");
  filtered_stderr_ = open_log(cfg_.duplicate_stderr_filters, "filtered_stderr.log");
}

void LaunchPlanner::prepare_run_path_barrier(const Environment& env) {
  remove_run_path_barrier();
  if (!cfg_.run_path) return;
  std::string tmpl = env_or(env, "TMPDIR", "/tmp");
  if (tmpl.empty()) tmpl = "/tmp";
  tmpl += "/muster-run-path-XXXXXX";
  std::vector<char> path(tmpl.begin(), tmpl.end());
  path.push_back('\0');
  if (::mkdtemp(path.data()) == nullptr) {
    // Without it the workers exit as soon as their scripts return.
    log::warning("--run-path: cannot create " + tmpl + " (" + std::strerror(errno) +
                 "); workers will not wait for each other at the end");
    return;
  }
  run_path_done_dir_ = path.data();
  extra_env_["MUSTER_RUN_PATH_DONE_DIR"] = run_path_done_dir_;
  extra_env_["MUSTER_RUN_PATH_WORKERS"] = std::to_string(cfg_.nproc_per_node);
}

void LaunchPlanner::remove_run_path_barrier() {
  extra_env_.clear();
  if (run_path_done_dir_.empty()) return;
  // One empty file per rank is all the workers leave there.
  std::error_code ignored;
  std::filesystem::remove_all(run_path_done_dir_, ignored);
  run_path_done_dir_.clear();
}

bool LaunchPlanner::finished_run_path_script(int global_rank) const {
  if (run_path_done_dir_.empty()) return false;
  std::string file = run_path_done_dir_ + "/" + std::to_string(global_rank);
  return ::access(file.c_str(), F_OK) == 0;
}

}  // namespace muster::launcher
