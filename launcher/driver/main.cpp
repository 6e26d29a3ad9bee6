// muster: the per-node agent, a drop-in for torchrun.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent.hpp"
#include "agent_metrics.hpp"
#include "cli.hpp"
#include "fanout.hpp"
#include "fanout_config.hpp"
#include "launch_channel.hpp"
#include "numa_binding.hpp"
#include "plan_process.hpp"
#include "python_env.hpp"
#include "muster/metrics/http.hpp"
#include "muster/common/version.hpp"
#include "muster/common/log.hpp"
#include "muster/common/random.hpp"

extern char** environ;

namespace {

using muster::launcher::Environment;

// The CPUs this process may run on (its affinity mask: taskset, cgroup
// cpusets), as torch counts them for --nproc-per-node=cpu|auto; all online
// CPUs when the mask cannot be read.
int usable_cpus() {
  auto mine = muster::launcher::numa::own_affinity();
  if (mine.ok() && !mine->empty()) return static_cast<int>(mine->size());
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string environment_python() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : muster::launcher::environment_python_of(self.string());
}

// --metrics-listen without a port (musterd's default is 9400).
constexpr int kAgentMetricsPort = 9401;

// Workers inherit 0-2; make sure they name something.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) < 0) {
      int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (n >= 0 && n != fd) {
        dup2(n, fd);
        close(n);
      }
    }
  }
}

Environment read_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

// NVIDIA devices without CUDA: the driver's /proc entries, else /dev/nvidiaN,
// narrowed by CUDA_VISIBLE_DEVICES as the CUDA runtime narrows them.
muster::Result<int> count_gpus(const Environment& env) {
  int devices = 0;
  for (int i = 0; i < 1024; ++i) {
    struct stat st{};
    if (stat(("/dev/nvidia" + std::to_string(i)).c_str(), &st) != 0) break;
    ++devices;
  }
  auto cvd = env.find("CUDA_VISIBLE_DEVICES");
  if (cvd == env.end()) return devices;
  int visible = 0;
  std::string v = cvd->second;
  std::size_t pos = 0;
  while (pos <= v.size()) {
    std::size_t comma = v.find(',', pos);
    std::string item = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    bool uuid = item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0;
    char* end = nullptr;
    long index = item.empty() ? -1 : std::strtol(item.c_str(), &end, 10);
    bool index_ok = !item.empty() && *end == '\0' && index >= 0 && index < devices;
    if (!uuid && !index_ok) break;  // CUDA stops at the first invalid entry
    ++visible;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return std::min(visible, devices);
}

// An agent a launching command started over ssh: the channel's header, read
// a byte at a time (what follows it stays in the pipe for the event loop),
// within channel::kHeaderWait.
muster::Result<muster::launcher::channel::Header> read_launch_header(int fd) {
  namespace channel = muster::launcher::channel;
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + channel::kHeaderWait;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return muster::Status(muster::Code::unavailable, "no word from the launching command on standard input within " +
                                                           std::to_string(channel::kHeaderWait.count() / 1000) + " s");
    }
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char c = 0;
    ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return muster::Status(muster::Code::unavailable,
                            "the launching command's channel (standard input) ended before its header: --from-launcher "
                            "is set by muster --hostfile, not by hand");
    }
    if (c == '\n') break;
    line.push_back(c);
    if (line.size() > channel::kMaxHeaderBytes) return channel::decode_header(line);
  }
  return channel::decode_header(line);
}

// Where a launching command's host list and its own binary are, for resolve_fanout.
muster::launcher::FanoutFacts fanout_facts(const muster::launcher::HostFacts& host, const Environment& env) {
  muster::launcher::FanoutFacts f;
  f.host = host;
  std::error_code ec;
  f.working_dir = std::filesystem::current_path(ec).string();
  f.muster_path = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  auto home = env.find("HOME");
  if (home != env.end()) f.home = home->second;
  f.read_file = [](const std::string& path) -> std::optional<std::string> {
    std::error_code e;
    if (!std::filesystem::is_regular_file(path, e)) return std::nullopt;
    std::FILE* in = std::fopen(path.c_str(), "rb");
    if (!in) return std::nullopt;
    std::string text;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, in)) > 0 && text.size() < (1u << 20)) text.append(buf, n);
    std::fclose(in);
    return text;
  };
  return f;
}

constexpr const char* kOmpBanner =
    "\n*****************************************\n"
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
    "system being overloaded, please further tune the variable for optimal performance in your "
    "application as needed. \n"
    "*****************************************";

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_fds();
  // Hold the usual termination signals from the first instruction on, so one
  // that arrives during start-up is handled rather than killing the agent.
  sigset_t early;
  sigemptyset(&early);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) sigaddset(&early, s);
  sigprocmask(SIG_BLOCK, &early, nullptr);
  signal(SIGPIPE, SIG_IGN);

  muster::log::init_from_env("muster");
  // One descriptor per agent or store client: take the whole hard limit.
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  Environment env = read_environment();
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string prog = "muster";

  auto parsed = muster::launcher::parse_args(args, env);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%smuster: error: %s\n", muster::launcher::usage_text(prog).c_str(),
                 parsed.status().message().c_str());
    return 2;
  }
  if (parsed->version) {
    std::printf("muster %s\n", muster::version_string());
    return 0;
  }
  if (parsed->help) {
    std::fputs(muster::launcher::help_text(prog).c_str(), stdout);
    return 0;
  }
  muster::launcher::HostFacts host;
  host.cpu_count = usable_cpus();
  host.gpu_count = [&env] { return count_gpus(env); };
  host.new_run_id = muster::random_uuid4;
  host.environment_python = environment_python();

  namespace channel = muster::launcher::channel;
  if (muster::launcher::wants_fanout(parsed.value())) {
    // muster --hostfile: this command launches the job on every host over ssh.
    auto fc = muster::launcher::resolve_fanout(parsed.value(), env, fanout_facts(host, env));
    if (!fc.ok()) {
      std::fprintf(stderr, "muster: error: %s\n", fc.status().message().c_str());
      return 1;
    }
    return muster::launcher::run_fanout(std::move(fc.value()), env);
  }
  for (const char* only : {"include", "exclude", "export"}) {
    if (parsed->given.count(only)) {
      std::fprintf(stderr, "%smuster: error: --%s is for a launch on several hosts: give --hostfile or --hosts\n",
                   muster::launcher::usage_text(prog).c_str(), only);
      return 2;
    }
  }
  std::optional<channel::Header> launched;
  muster::net::UniqueFd launch_channel;
  if (auto v = parsed->values.find("from_launcher"); v != parsed->values.end()) {
    // Started over ssh by muster --hostfile: the same muster, then the header.
    if (v->second != muster::version_string()) {
      std::fprintf(stderr,
                   "muster: error: this host runs muster %s, the launching command muster %s: install the same "
                   "muster on every host\n",
                   muster::version_string(), v->second.c_str());
      return 1;
    }
    auto header = read_launch_header(STDIN_FILENO);
    if (!header.ok()) {
      std::fprintf(stderr, "muster: error: %s\n", header.status().message().c_str());
      return 1;
    }
    auto ssh_connection = env.count("SSH_CONNECTION") ? env.at("SSH_CONNECTION") : std::string();
    auto endpoint = channel::resolve_endpoint(header->rdzv_endpoint, ssh_connection);
    if (!endpoint.ok()) {
      std::fprintf(stderr, "muster: error: %s\n", endpoint.status().message().c_str());
      return 1;
    }
    for (const auto& [name, value] : header->env) env[name] = value;
    parsed->values["rdzv_endpoint"] = endpoint.value();
    parsed->given["rdzv_endpoint"] = true;
    // The channel moves off standard input, which the workers get as /dev/null.
    launch_channel = muster::net::UniqueFd(fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3));
    int null_fd = open("/dev/null", O_RDONLY);
    if (!launch_channel || null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0) {
      std::fprintf(stderr, "muster: error: cannot move the launch channel off standard input: %s\n", std::strerror(errno));
      return 1;
    }
    close(null_fd);
    std::printf("%s%s\n", std::string(channel::kReadyLine).c_str(), muster::version_string());
    std::fflush(stdout);
    launched = std::move(header.value());
  }
  // As torchrun: a command line argparse refuses exits 2 with the usage; one it
  // accepts but that cannot be run (torchrun's config_from_args raises) exits 1.
  auto cfg = muster::launcher::resolve_config(parsed.value(), env, host);
  if (!cfg.ok()) {
    std::fprintf(stderr, "muster: error: %s\n", cfg.status().message().c_str());
    return 1;
  }
  if (launched) {
    cfg->launch_order = launched->order;
    cfg->launch_key_hex = launched->key_hex;
    // Every node's output meets in the launching command's: one report.
    cfg->one_report_per_job = true;
  }
  for (const auto& w : cfg->warnings) muster::log::warning(w);
  for (const auto& n : cfg->notices) std::fprintf(stderr, "muster: %s\n", n.c_str());
  if (cfg->numa_binding) {
    // Once, before the rendezvous: a binding that cannot be made ends the
    // launch (exit 1), and is never a restart.
    // In a child: the CUDA driver and hwloc's plugins stay out of the agent.
    const auto mode = *cfg->numa_binding;
    const int nproc = cfg->nproc_per_node;
    auto cvd = env.find("CUDA_VISIBLE_DEVICES");
    std::optional<std::string> visible;
    if (cvd != env.end()) visible = cvd->second;
    auto bindings = muster::launcher::numa::plan_in_child(
        [&] { return muster::launcher::numa::plan_on_this_machine(mode, nproc, visible); });
    if (!bindings.ok()) {
      std::fprintf(stderr, "muster: error: %s\n", bindings.status().message().c_str());
      return 1;
    }
    for (const auto& b : bindings.value()) {
      muster::log::info(muster::launcher::numa::describe(*cfg->numa_binding, b));
      cfg->worker_cpus.push_back(b.cpus);
    }
  }
  if (cfg->set_omp_num_threads) {
    env["OMP_NUM_THREADS"] = "1";
    muster::log::warning(kOmpBanner);
  }
  env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = cfg->signals_to_handle;

  boost::asio::io_context io(1);
  // The signals the agent handles stay blocked for good and are read from a
  // signalfd; those of the early set it does not handle get their default back.
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : cfg->signal_numbers) sigaddset(&handled, s);
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  sigset_t unhandled;
  sigemptyset(&unhandled);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
    if (!sigismember(&handled, s)) sigaddset(&unhandled, s);
  }
  auto signals = muster::launcher::SignalSource::open(io, cfg->signal_numbers);
  if (!signals.ok()) {
    std::fprintf(stderr, "muster: error: %s\n", signals.status().message().c_str());
    return 1;
  }
  sigprocmask(SIG_UNBLOCK, &unhandled, nullptr);

  std::string metrics_listen = cfg->metrics_listen;
  muster::launcher::Agent agent(io, *signals.value(), std::move(cfg.value()), std::move(env));
  std::unique_ptr<muster::metrics::HttpServer> metrics;
  if (!metrics_listen.empty()) {
    auto m = muster::metrics::HttpServer::listen_at(io, "--metrics-listen", metrics_listen, kAgentMetricsPort, [&agent] {
      return muster::launcher::render_agent_metrics(agent.metrics(), muster::version_number(), muster::git_revision());
    });
    if (!m.ok()) {
      std::fprintf(stderr, "muster: error: %s\n", m.status().message().c_str());
      return 1;
    }
    metrics = std::move(m.value());
    muster::log::info("metrics on http://" + metrics->endpoint() + "/metrics");
  }
  if (launch_channel) {
    agent.attach_launcher(std::move(launch_channel),
                          std::chrono::milliseconds(channel::kSilentBeats * launched->heartbeat_ms));
  }
  return agent.run();
}
