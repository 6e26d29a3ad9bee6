#include "shim.hpp"

#include "muster/common/fd_io.hpp"
#include "muster/common/log.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>
#include <ctime>
#include <fstream>
#include <sstream>

namespace muster::launcher {
namespace {

constexpr int kControlFd = 3;

std::vector<pid_t> list_children() {
  std::vector<pid_t> out;
  pid_t self = getpid();
  std::ifstream in("/proc/self/task/" + std::to_string(self) + "/children");
  if (in) {
    pid_t p = 0;
    while (in >> p) out.push_back(p);
    return out;
  }
  // Kernels without /proc/<pid>/task/<tid>/children: scan /proc for our children.
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    std::getline(stat, line);
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == self) out.push_back(static_cast<pid_t>(pid));
  }
  closedir(dir);
  return out;
}

void sleep_ms(int ms) {
  timespec ts{0, ms * 1000000L};
  nanosleep(&ts, nullptr);
}

// Kills the worker's group and every child we have (adopted orphans included),
// reaping all but `keep` (left a zombie so its PID and PGID stay reserved).
// Bounded: gives up after about two seconds.
void kill_everything(pid_t worker, pid_t keep) {
  for (int round = 0; round < 400; ++round) {
    if (worker > 0) kill(-worker, SIGKILL);
    bool others = false;
    for (pid_t child : list_children()) {
      if (child == keep) continue;
      others = true;
      kill(-child, SIGKILL);
      kill(child, SIGKILL);
      waitpid(child, nullptr, WNOHANG);
    }
    if (keep <= 0) {
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
    }
    if (!others && (keep > 0 || list_children().empty())) return;
    sleep_ms(5);
  }
}

// close_range(2) where the kernel has it (5.9+), else every fd /proc lists.
void close_inherited_fds(int from) {
  if (syscall(SYS_close_range, from, ~0U, 0) == 0) return;
  std::vector<int> fds;
  if (DIR* dir = opendir("/proc/self/fd")) {
    int own = dirfd(dir);
    while (dirent* e = readdir(dir)) {
      int fd = std::atoi(e->d_name);
      if (fd >= from && fd != own) fds.push_back(fd);
    }
    closedir(dir);
  } else {
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    int top = lim.rlim_cur == RLIM_INFINITY ? 65536 : static_cast<int>(std::min<rlim_t>(lim.rlim_cur, 1 << 20));
    for (int fd = from; fd < top; ++fd) fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
}

[[noreturn]] void exit_like(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, nullptr);
    kill(getpid(), sig);
    _exit(128 + sig);
  }
  _exit(WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 1);
}

[[noreturn]] void exec_worker(const ShimSpec& spec, int signal_fd, pid_t shim) {
  // A session of its own: the worker's PGID is its PID, as under torchrun.
  setsid();
  // Should the shim itself be killed (an outside SIGKILL, the OOM killer),
  // the worker goes with it rather than living on unsupervised.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != shim) _exit(137);
  close(kControlFd);
  close(signal_fd);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  execve(spec.path.c_str(), argv.data(), envp.data());
  int err = errno;
  std::string msg = "muster: cannot execute '" + spec.path + "': " + std::strerror(err) + "\n";
  write_fully(STDERR_FILENO, msg.data(), msg.size());
  _exit(err == ENOENT ? 127 : 126);
}

}  // namespace

void run_shim(const ShimSpec& spec) {
  // The agent's log writer lives in a thread this forked copy does not have.
  log::set_writer(nullptr);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    signal(sig, SIG_DFL);
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  prctl(PR_SET_NAME, "muster-shim");
  // Out of the agent's process group: a terminal's Ctrl-C reaches the agent,
  // which decides what the workers get.
  setpgid(0, 0);

  if (spec.stdout_fd >= 0 && spec.stdout_fd != STDOUT_FILENO) dup2(spec.stdout_fd, STDOUT_FILENO);
  if (spec.stderr_fd >= 0 && spec.stderr_fd != STDERR_FILENO) dup2(spec.stderr_fd, STDERR_FILENO);
  if (spec.control_fd != kControlFd) dup2(spec.control_fd, kControlFd);
  // Nothing of the agent's (its sockets, other workers' pipes) may leak into the worker.
  close_inherited_fds(kControlFd + 1);
  fcntl(kControlFd, F_SETFD, FD_CLOEXEC);

  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGWINCH, SIGCONT}) {
    sigaddset(&handled, sig);
  }
  int sfd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);

  pid_t shim_pid = getpid();
  pid_t worker = fork();
  if (worker < 0) {
    std::string msg = std::string("muster: cannot start a worker process: ") + std::strerror(errno) + "\n";
    write_fully(STDERR_FILENO, msg.data(), msg.size());
    _exit(1);
  }
  if (worker == 0) exec_worker(spec, sfd, shim_pid);

  int32_t pid32 = worker;
  write_fully(kControlFd, reinterpret_cast<const char*>(&pid32), sizeof pid32);

  int status = 0;
  bool agent_gone = false;
  while (true) {
    pollfd fds[2] = {{kControlFd, POLLIN, 0}, {sfd, POLLIN, 0}};
    int n = poll(fds, 2, -1);
    if (n < 0 && errno != EINTR) break;
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      unsigned char buf[64];
      ssize_t r = read(kControlFd, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        agent_gone = true;
        break;
      }
      for (ssize_t i = 0; i < r; ++i) {
        if (kill(-worker, buf[i]) != 0) kill(worker, buf[i]);
      }
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo info{};
      bool worker_done = false;
      while (read(sfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        if (static_cast<int>(info.ssi_signo) != SIGCHLD) {
          // Someone signalled the shim itself: pass it on, as the agent would.
          if (kill(-worker, static_cast<int>(info.ssi_signo)) != 0) kill(worker, static_cast<int>(info.ssi_signo));
        }
      }
      // Reap adopted orphans as they die; peek at the worker without reaping it.
      for (pid_t child : list_children()) {
        if (child != worker) waitpid(child, nullptr, WNOHANG);
      }
      siginfo_t si{};
      if (waitid(P_PID, static_cast<id_t>(worker), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == worker) {
        worker_done = true;
      }
      if (worker_done) break;
    }
  }
  if (agent_gone) {
    kill_everything(worker, -1);
    _exit(137);
  }
  // The worker has exited: nothing it started may outlive it.
  kill_everything(worker, worker);
  waitpid(worker, &status, 0);
  exit_like(status);
}

}  // namespace muster::launcher
