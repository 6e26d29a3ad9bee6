#include "plan_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "cuda_devices.hpp"
#include "muster/common/fd_io.hpp"
#include "muster/common/log.hpp"

namespace muster::launcher::numa {

namespace {

// An answer larger than this is not one the child wrote (8192 ranks of long CPU lists fit).
constexpr std::size_t kMaxAnswer = 64 * 1024 * 1024;

std::string one_line(std::string text) {
  for (auto& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::string how_it_ended(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("died of ") + strsignal(WTERMSIG(status));
  return "ended";
}

}  // namespace

std::string encode_plan(const Result<std::vector<Binding>>& plan) {
  std::ostringstream out;
  if (!plan.ok()) {
    out << "error " << static_cast<int>(plan.status().code()) << ' ' << one_line(plan.status().message()) << '\n';
    return out.str();
  }
  for (const auto& b : plan.value()) {
    out << "bind " << b.local_rank << ' ' << b.gpu_index << ' ' << b.gpu_pci << ' ' << b.numa_node << ' '
        << (b.cpus.empty() ? "-" : format_cpu_list(b.cpus)) << '\n';
  }
  out << "end\n";
  return out.str();
}

Result<std::vector<Binding>> decode_plan(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::vector<Binding> bindings;
  auto bad = [&] { return Status(Code::internal, "the --numa-binding planner's answer is garbled: '" + line + "'"); };
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "end") return bindings;
    if (kind == "error") {
      int code = 0;
      fields >> code;
      std::string message;
      std::getline(fields, message);
      if (!message.empty() && message.front() == ' ') message.erase(0, 1);
      if (!fields && message.empty()) return bad();
      if (code <= static_cast<int>(Code::ok) || code > static_cast<int>(Code::internal)) code = static_cast<int>(Code::internal);
      return Status(static_cast<Code>(code), message);
    }
    if (kind != "bind") return bad();
    Binding b;
    std::string cpus;
    if (!(fields >> b.local_rank >> b.gpu_index >> b.gpu_pci >> b.numa_node >> cpus)) return bad();
    if (cpus != "-") {
      auto set = parse_cpu_list(cpus);
      if (!set.ok()) return bad();
      b.cpus = std::move(set.value());
    }
    bindings.push_back(std::move(b));
  }
  return Status(Code::internal, "the --numa-binding planner's answer ended early");
}

Result<std::vector<Binding>> plan_in_child(const Planner& planner, std::chrono::milliseconds limit) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return io_error(std::string("cannot create a pipe: ") + std::strerror(errno));
  const pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) {
    int err = errno;
    close(fds[0]);
    close(fds[1]);
    return io_error(std::string("cannot fork the --numa-binding planner: ") + std::strerror(err));
  }
  if (child == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    std::string answer = encode_plan(planner());
    bool sent = write_fully(fds[1], answer.data(), answer.size());
    _exit(sent ? 0 : 1);
  }
  close(fds[1]);
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool timed_out = false;
  bool read_failed = false;
  char buf[65536];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      read_failed = true;
      break;
    }
    if (ready == 0) continue;
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      read_failed = n < 0;
      break;
    }
    answer.append(buf, static_cast<std::size_t>(n));
    if (answer.size() > kMaxAnswer) {
      read_failed = true;
      break;
    }
  }
  close(fds[0]);
  if (timed_out || read_failed) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return Status(Code::timeout, "--numa-binding: the GPU and topology query did not answer within " +
                                     std::to_string(limit.count() / 1000) +
                                     " s; check the GPUs with nvidia-smi, or drop --numa-binding");
  }
  auto plan = decode_plan(answer);
  if (!plan.ok() && plan.status().code() == Code::internal && answer.find("error ") != 0) {
    return Status(Code::internal, "--numa-binding: the GPU and topology query " + how_it_ended(status) +
                                      " without an answer (the CUDA driver crashed?); check the GPUs with "
                                      "nvidia-smi, or drop --numa-binding");
  }
  return plan;
}

Result<std::vector<Binding>> plan_on_this_machine(Mode mode, int nproc,
                                                  const std::optional<std::string>& cuda_visible_devices) {
  Machine machine;
  auto gpus = cuda_pci_addresses();
  if (!gpus.ok()) return gpus.status();
  if (gpus->empty()) {
    return invalid_argument(
        std::string("--numa-binding binds each worker to the CPUs near its GPU, and the CUDA driver shows no GPU") +
        (cuda_visible_devices ? " (CUDA_VISIBLE_DEVICES='" + *cuda_visible_devices + "')" : std::string()) +
        "; drop --numa-binding on a machine without GPUs");
  }
  machine.gpu_pci = std::move(gpus.value());
  auto allowed = own_affinity();
  if (!allowed.ok()) return allowed.status();
  machine.allowed = std::move(allowed.value());
  auto topology = open_topology();
  if (!topology.ok()) {
    // hwloc failed where sysfs may not: torch reads sysfs alone.
    log::warning("--numa-binding: " + topology.status().message() + "; reading sysfs instead");
    topology = open_topology(Backend::sysfs);
  }
  return plan(mode, nproc, *topology.value(), machine);
}

}  // namespace muster::launcher::numa
