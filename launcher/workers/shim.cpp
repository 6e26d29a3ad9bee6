#include "shim.hpp"

#include "muster/common/fd_io.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <ctime>

namespace muster::launcher {

PreparedShim::PreparedShim(ShimSpec s) : spec(std::move(s)) {
  argv.reserve(spec.argv.size() + 1);
  for (auto& a : spec.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  envp.reserve(spec.envp.size() + 1);
  for (auto& e : spec.envp) envp.push_back(e.data());
  envp.push_back(nullptr);
}

// Everything below runs in the forked copy of the agent (shim.hpp): no heap,
// no stdio or iostreams, no logging; fixed buffers on the stack.
namespace {

constexpr int kControlFd = 3;
// Buffers for reading /proc: a children list, a directory, a stat line.
constexpr std::size_t kProcReadBuffer = 4096;
constexpr std::size_t kStatHead = 256;

// Writes the decimal digits of v (>= 0) at out, returning the end.
char* put_decimal(char* out, long v) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && n < static_cast<int>(sizeof digits));
  while (n > 0) *out++ = digits[--n];
  return out;
}

// Copies s to out, stopping at end; returns where it stopped.
char* put_text(char* out, const char* end, const char* s) {
  while (*s != '\0' && out < end) *out++ = *s++;
  return out;
}

int open_read(const char* path, int flags = 0) {
  int fd;
  do {
    fd = open(path, O_RDONLY | O_CLOEXEC | flags);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

ssize_t read_some(int fd, char* buf, std::size_t len) {
  ssize_t n;
  do {
    n = read(fd, buf, len);
  } while (n < 0 && errno == EINTR);
  return n;
}

// Calls visit(name) for each entry of the directory open at dir_fd, read
// with getdents64 into a fixed buffer. visit may close descriptors.
template <class Visit>
void for_each_entry(int dir_fd, Visit&& visit) {
  alignas(8) char buf[kProcReadBuffer];
  while (true) {
    long n = syscall(SYS_getdents64, dir_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (long at = 0; at < n;) {
      // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
      unsigned short reclen;
      std::memcpy(&reclen, buf + at + 16, sizeof reclen);
      if (reclen == 0) return;
      visit(static_cast<const char*>(buf + at + 19));
      at += reclen;
    }
  }
}

// A whole decimal number (> 0), or -1.
long parse_pid(const char* s) {
  long v = 0;
  if (*s == '\0') return -1;
  for (; *s != '\0'; ++s) {
    if (*s < '0' || *s > '9' || v > (1L << 40)) return -1;
    v = v * 10 + (*s - '0');
  }
  return v > 0 ? v : -1;
}

// The parent PID in /proc/<pid>/stat, or -1.
long parent_of(long pid) {
  char path[48] = "/proc/";
  char* p = put_decimal(path + 6, pid);
  std::memcpy(p, "/stat", 6);
  int fd = open_read(path);
  if (fd < 0) return -1;
  char line[kStatHead + 1];
  ssize_t n = read_some(fd, line, kStatHead);
  close(fd);
  if (n <= 0) return -1;
  line[n] = '\0';
  // "pid (comm) state ppid ...": comm may hold anything, so the last ')'
  // ends it; the fields after it are numbers and one letter.
  char* close_paren = std::strrchr(line, ')');
  if (close_paren == nullptr || close_paren + 4 >= line + n) return -1;
  const char* q = close_paren + 4;  // past ") S "
  long v = 0;
  bool any = false;
  for (; *q >= '0' && *q <= '9'; ++q) {
    v = v * 10 + (*q - '0');
    any = true;
  }
  return any ? v : -1;
}

// Calls visit(pid) for each child of this process: from the kernel's
// children list, or, on a kernel built without it, a scan of /proc.
template <class Visit>
void for_each_child(Visit&& visit) {
  pid_t self = getpid();
  char path[64] = "/proc/self/task/";
  char* p = put_decimal(path + 16, self);
  std::memcpy(p, "/children", 10);
  if (int fd = open_read(path); fd >= 0) {
    char buf[kProcReadBuffer];
    long v = 0;
    bool in_number = false;
    while (true) {
      ssize_t n = read_some(fd, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] >= '0' && buf[i] <= '9') {
          v = v * 10 + (buf[i] - '0');
          in_number = true;
        } else if (in_number) {
          visit(static_cast<pid_t>(v));
          v = 0;
          in_number = false;
        }
      }
    }
    if (in_number) visit(static_cast<pid_t>(v));
    close(fd);
    return;
  }
  int dir = open_read("/proc", O_DIRECTORY);
  if (dir < 0) return;
  for_each_entry(dir, [&](const char* name) {
    long pid = parse_pid(name);
    if (pid > 0 && parent_of(pid) == self) visit(static_cast<pid_t>(pid));
  });
  close(dir);
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
    for_each_child([&](pid_t child) {
      if (child == keep) return;
      others = true;
      kill(-child, SIGKILL);
      kill(child, SIGKILL);
      waitpid(child, nullptr, WNOHANG);
    });
    if (keep <= 0) {
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
    }
    if (others) {
      sleep_ms(5);
      continue;
    }
    if (keep > 0) return;
    bool any = false;
    for_each_child([&](pid_t) { any = true; });
    if (!any) return;
    sleep_ms(5);
  }
}

// close_range(2) where the kernel has it (5.9+), else every fd /proc lists,
// else every fd below the limit.
void close_inherited_fds(int from) {
  if (syscall(SYS_close_range, from, ~0U, 0) == 0) return;
  int dir = open_read("/proc/self/fd", O_DIRECTORY);
  if (dir >= 0) {
    // /proc lists descriptors in order, so closing those already listed
    // leaves the rest of the listing as it was.
    for_each_entry(dir, [&](const char* name) {
      long fd = parse_pid(name);  // 0 is never above `from`
      if (fd >= from && fd != dir) close(static_cast<int>(fd));
    });
    close(dir);
    return;
  }
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  int top = lim.rlim_cur == RLIM_INFINITY ? 65536 : static_cast<int>(std::min<rlim_t>(lim.rlim_cur, 1 << 20));
  for (int fd = from; fd < top; ++fd) close(fd);
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

// fork() runs the handlers libraries registered with pthread_atfork, code
// that is no business of the shim's; _Fork (glibc 2.34) runs none.
pid_t fork_plainly() {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 34)
  return _Fork();
#else
  return fork();
#endif
}

// Writes "<what><detail><after>: <error text>" to stderr, one write.
void say_failure(const char* what, const char* detail, const char* after, int err) {
  char msg[1024];
  const char* end = msg + sizeof msg - 1;
  char* p = put_text(msg, end, what);
  p = put_text(p, end, detail);
  p = put_text(p, end, after);
  p = put_text(p, end, ": ");
  const char* why = strerrordesc_np(err);  // a constant string: no locale, no heap
  p = put_text(p, end, why != nullptr ? why : "unknown error");
  *p++ = '\n';
  write_fully(STDERR_FILENO, msg, static_cast<std::size_t>(p - msg));
}

[[noreturn]] void exec_worker(const PreparedShim& shim, int signal_fd, pid_t shim_pid, pid_t agent_pid) {
  // A session of its own: the worker's PGID is its PID, as under torchrun.
  setsid();
  // Where Yama restricts ptrace (ptrace_scope=1) only an ancestor may attach,
  // and the agent is the worker's grandparent through the shim: name it, so
  // the agent's py-spy can take the stacks of a hung worker (stack_dump.hpp).
  // Without Yama this fails with EINVAL, and nothing is needed.
  prctl(PR_SET_PTRACER, agent_pid, 0, 0, 0);
  // Should the shim itself be killed (an outside SIGKILL, the OOM killer),
  // the worker goes with it rather than living on unsupervised.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != shim_pid) _exit(137);
  close(kControlFd);
  close(signal_fd);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (!shim.spec.cpu_mask.empty() &&
      syscall(SYS_sched_setaffinity, 0, shim.spec.cpu_mask.size() * sizeof(unsigned long),
              shim.spec.cpu_mask.data()) != 0) {
    // The CPUs were the agent's own when it planned the binding: a cpuset
    // that shrank since then leaves none of them.
    say_failure("muster: cannot bind the worker to its --numa-binding CPUs", "", "", errno);
    _exit(126);
  }

  execve(shim.spec.path.c_str(), shim.argv.data(), shim.envp.data());
  int err = errno;
  say_failure("muster: cannot execute '", shim.spec.path.c_str(), "'", err);
  _exit(err == ENOENT ? 127 : 126);
}

}  // namespace

void run_shim(const PreparedShim& shim) {
  // The shim never logs: the agent's log writer is a thread this copy does
  // not have, and its queue takes the heap.
  const ShimSpec& spec = shim.spec;
  const pid_t agent_pid = getppid();
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    signal(sig, SIG_DFL);
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // The system call itself: a sanitizer's prctl wrapper records PR_SET_NAME in
  // its thread registry, under that registry's lock.
  syscall(SYS_prctl, PR_SET_NAME, "muster-shim", 0, 0, 0);
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
  pid_t worker = fork_plainly();
  if (worker < 0) {
    say_failure("muster: cannot start a worker process", "", "", errno);
    _exit(1);
  }
  if (worker == 0) exec_worker(shim, sfd, shim_pid, agent_pid);

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
      // The moment the worker's end reached us, before any work of ours: the
      // rendezvous orders the nodes' failures by it (which came first).
      timespec seen{};
      clock_gettime(CLOCK_REALTIME, &seen);
      signalfd_siginfo info{};
      bool worker_done = false;
      while (read(sfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        if (static_cast<int>(info.ssi_signo) != SIGCHLD) {
          // Someone signalled the shim itself: pass it on, as the agent would.
          if (kill(-worker, static_cast<int>(info.ssi_signo)) != 0) kill(worker, static_cast<int>(info.ssi_signo));
        }
      }
      // Reap adopted orphans as they die; peek at the worker without reaping it.
      for_each_child([&](pid_t child) {
        if (child != worker) waitpid(child, nullptr, WNOHANG);
      });
      siginfo_t si{};
      if (waitid(P_PID, static_cast<id_t>(worker), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == worker) {
        worker_done = true;
      }
      if (worker_done) {
        int64_t exited_us = static_cast<int64_t>(seen.tv_sec) * 1000000 + seen.tv_nsec / 1000;
        // One datagram, never a SIGPIPE: an agent already gone reads nothing.
        (void)send(kControlFd, &exited_us, sizeof exited_us, MSG_NOSIGNAL | MSG_DONTWAIT);
        break;
      }
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
