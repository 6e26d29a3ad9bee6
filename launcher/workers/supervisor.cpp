#include "supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "muster/common/log.hpp"
#include "muster/net/unique_fd.hpp"
#include "shim.hpp"

namespace muster::launcher {
namespace {

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

std::string errno_text() { return std::strerror(errno); }

// An fd for the worker's end of one stream, and the agent's end when tee'd.
struct StreamFds {
  net::UniqueFd child;   // given to the shim (none: inherit)
  net::UniqueFd parent;  // tee: the pipe's read end
  net::UniqueFd file;    // tee: the log file
};

Result<StreamFds> open_stream(const StreamPlan& plan) {
  StreamFds fds;
  auto open_file = [](const std::string& path) {
    return net::UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  };
  switch (plan.mode) {
    case StreamPlan::Mode::inherit:
      return fds;
    case StreamPlan::Mode::devnull:
      fds.child.reset(::open("/dev/null", O_WRONLY | O_CLOEXEC));
      if (!fds.child) return io_error("cannot open /dev/null: " + errno_text());
      return fds;
    case StreamPlan::Mode::file:
      fds.child = open_file(plan.path);
      if (!fds.child) return io_error("cannot create the log file " + plan.path + ": " + errno_text());
      return fds;
    case StreamPlan::Mode::tee: {
      int p[2];
      if (pipe2(p, O_CLOEXEC) != 0) return io_error("cannot create a pipe: " + errno_text());
      fds.parent.reset(p[0]);
      fds.child.reset(p[1]);
      if (!plan.path.empty()) {
        fds.file = open_file(plan.path);
        if (!fds.file) return io_error("cannot create the log file " + plan.path + ": " + errno_text());
      }
      return fds;
    }
  }
  return fds;
}

ExitStatus from_siginfo(const siginfo_t& si) {
  ExitStatus s;
  if (si.si_code == CLD_EXITED) {
    s.value = si.si_status;
  } else {
    s.signaled = true;
    s.value = si.si_status;
  }
  return s;
}

}  // namespace

struct Supervisor::Worker {
  explicit Worker(boost::asio::io_context& io) : pidfd(io), control_sd(io), drain_timer(io) {}
  int local_rank = 0;
  pid_t shim_pid = 0;
  pid_t pid = 0;
  int control = -1;  // the control socket's fd, owned by control_sd
  boost::asio::posix::stream_descriptor pidfd;
  boost::asio::posix::stream_descriptor control_sd;
  std::vector<std::shared_ptr<OutputPump>> pumps;
  bool exited = false;
  // The exit, held back until the worker's tee'd output has all been passed on.
  std::optional<WorkerExit> pending_exit;
  boost::asio::steady_timer drain_timer;
};

namespace {
// How long a tee pipe may stay open after its worker's shim exited (a writer
// stuck in the kernel) before the exit is reported anyway.
constexpr auto kDrainLimit = std::chrono::seconds(2);
// A shim's exit time further back than this is not believed (a clock step).
constexpr auto kExitTimeLimit = std::chrono::seconds(60);

// Takes the next datagram from the shim into `value` if it is exactly that
// size (MSG_TRUNC gives the datagram's whole length); a datagram of another
// size is dropped. Never blocks.
template <typename T>
bool take_datagram(int fd, T& value) {
  return ::recv(fd, &value, sizeof value, MSG_DONTWAIT | MSG_TRUNC) == static_cast<ssize_t>(sizeof value);
}
}  // namespace

Supervisor::Supervisor(boost::asio::io_context& io, ExitHandler on_exit) : io_(io), on_exit_(std::move(on_exit)) {}

Supervisor::~Supervisor() {
  // Pumps may outlive this (a pending read holds them): they must not call
  // back into it, nor into the writer, which goes soon after.
  for (auto& w : workers_) {
    for (auto& pump : w->pumps) pump->abandon();
  }
  // Closing the control sockets tells every shim still running that the agent
  // is done: each kills its worker's tree. All are told first, then awaited.
  for (auto& w : workers_) close_control(*w);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& w : workers_) {
    if (w->exited || !w->pidfd.is_open()) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{w->pidfd.native_handle(), POLLIN, 0};
    poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
    siginfo_t si{};
    waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(w->pidfd.native_handle()), &si, WEXITED | WNOHANG);
  }
}

Status Supervisor::start(const std::vector<WorkerLaunch>& launches) {
  workers_.clear();
  for (const auto& launch : launches) {
    // Every descriptor below closes by itself on each early return.
    auto out = open_stream(launch.out);
    if (!out.ok()) return out.status();
    auto err = open_stream(launch.err);
    if (!err.ok()) return err.status();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      return io_error("cannot create a control socket: " + errno_text());
    }
    net::UniqueFd control_agent(sv[0]);
    net::UniqueFd control_shim(sv[1]);
    ShimSpec spec;
    spec.control_fd = control_shim.get();
    spec.stdout_fd = out->child.get();
    spec.stderr_fd = err->child.get();
    spec.path = launch.path;
    spec.argv = launch.argv;
    spec.envp = launch.envp;
    spec.cpu_mask = launch.cpu_mask;
    // Laid out for execve here: the forked copy must not touch the heap.
    const PreparedShim prepared(std::move(spec));

    // All signals blocked across fork: the child must not run the agent's handlers.
    sigset_t all;
    sigset_t old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid_t shim = fork();
    if (shim == 0) run_shim(prepared);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, nullptr);
    // The shim's ends are the shim's now.
    control_shim.reset();
    out->child.reset();
    err->child.reset();
    if (shim < 0) return io_error(std::string("cannot fork a worker: ") + std::strerror(fork_errno));
    auto w = std::make_unique<Worker>(io_);
    w->local_rank = launch.local_rank;
    w->shim_pid = shim;
    w->control = control_agent.get();
    w->control_sd.assign(control_agent.release());
    int pfd = pidfd_open(shim);
    if (pfd < 0) {
      std::string why = errno_text();
      // Closing the control socket makes the shim take its worker down and exit.
      close_control(*w);
      waitpid(shim, nullptr, 0);
      return io_error("pidfd_open failed (muster needs Linux 5.4 or newer): " + why);
    }
    w->pidfd.assign(pfd);
    auto add_pump = [&](StreamFds& fds, const StreamPlan& plan) {
      if (!fds.parent) return;
      PumpTargets targets = plan.tee;
      targets.file = {};
      if (fds.file && targets.writer != nullptr) targets.file = targets.writer->add_owned(std::move(fds.file), plan.path);
      auto pump = std::make_shared<OutputPump>(io_, fds.parent.release(), std::move(targets));
      Worker* wp = w.get();
      pump->start([this, wp] { deliver_if_drained(*wp); });
      w->pumps.push_back(std::move(pump));
    };
    add_pump(out.value(), launch.out);
    add_pump(err.value(), launch.err);
    workers_.push_back(std::move(w));
    watch(*workers_.back());
    watch_pid(*workers_.back());
  }
  return {};
}

void Supervisor::close_control(Worker& w) {
  if (w.control < 0) return;
  boost::system::error_code ignored;
  w.control_sd.close(ignored);
  w.control = -1;
}

// The shim sends the worker's PID once it has forked it; the event loop
// takes it when it comes, never waiting for it.
void Supervisor::watch_pid(Worker& w) {
  w.control_sd.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                          [this, &w](const boost::system::error_code& ec) {
                            if (ec) return;
                            read_pid(w);
                          });
}

void Supervisor::read_pid(Worker& w) {
  if (w.pid != 0 || w.control < 0) return;
  int32_t pid = 0;
  if (take_datagram(w.control, pid)) {
    w.pid = pid;
    if (on_pid_) on_pid_(w.local_rank, pid);
  }
}

// The time the shim saw its worker end (the shim's last datagram), when it
// sent one: closer to the exit than the moment this loop learns of it, which
// waits for the shim's clean-up and for this process to be scheduled. Only a
// time within a minute before now is taken (a clock stepped meanwhile).
std::optional<std::chrono::system_clock::time_point> Supervisor::read_exit_time(Worker& w) {
  if (w.control < 0) return std::nullopt;
  int64_t us = 0;
  if (!take_datagram(w.control, us)) return std::nullopt;
  auto seen = std::chrono::system_clock::time_point(std::chrono::microseconds(us));
  auto now = std::chrono::system_clock::now();
  if (seen > now || now - seen > kExitTimeLimit) return std::nullopt;
  return seen;
}

void Supervisor::watch(Worker& w) {
  w.pidfd.async_wait(boost::asio::posix::stream_descriptor::wait_read, [this, &w](const boost::system::error_code& ec) {
    if (ec) return;
    on_shim_exit(w);
  });
}

void Supervisor::on_shim_exit(Worker& w) {
  siginfo_t si{};
  if (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(w.pidfd.native_handle()), &si, WEXITED) != 0) {
    log::error("cannot collect the exit of worker " + std::to_string(w.local_rank) + ": " + errno_text());
    si.si_code = CLD_KILLED;
    si.si_status = SIGKILL;
  }
  read_pid(w);
  WorkerExit e;
  e.when = std::chrono::system_clock::now();
  if (auto seen = read_exit_time(w)) e.when = *seen;
  w.exited = true;
  close_control(w);
  e.local_rank = w.local_rank;
  e.pid = w.pid != 0 ? w.pid : w.shim_pid;
  e.status = from_siginfo(si);
  w.pending_exit = e;
  // The shim exits only after every process of the worker's tree is gone, so
  // the pipes reach end-of-file promptly; the limit covers a writer stuck in
  // the kernel.
  Worker* wp = &w;
  w.drain_timer.expires_after(kDrainLimit);
  w.drain_timer.async_wait([this, wp](const boost::system::error_code& ec) {
    if (ec) return;
    for (auto& pump : wp->pumps) pump->stop();
    deliver_if_drained(*wp);
  });
  deliver_if_drained(w);
}

void Supervisor::deliver_if_drained(Worker& w) {
  if (!w.pending_exit) return;
  for (auto& pump : w.pumps) {
    if (!pump->finished()) return;
  }
  WorkerExit e = *w.pending_exit;
  w.pending_exit.reset();
  w.drain_timer.cancel();
  on_exit_(e);  // may start the next attempt, destroying w: nothing of w after this
}

void Supervisor::signal_all(int signo) {
  for (auto& w : workers_) signal_one(w->local_rank, signo);
}

void Supervisor::signal_one(int local_rank, int signo) {
  Worker* w = find(local_rank);
  if (w == nullptr || w->exited || w->control < 0) return;
  unsigned char b = static_cast<unsigned char>(signo);
  // A failed send means the shim is already gone, and with it the worker's
  // tree; a PID-based fallback could hit a reused process group.
  (void)::send(w->control, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

Supervisor::Worker* Supervisor::find(int local_rank) {
  for (const auto& w : workers_) {
    if (w->local_rank == local_rank) return w.get();
  }
  return nullptr;
}

pid_t Supervisor::worker_pid(int local_rank) {
  Worker* w = find(local_rank);
  if (w == nullptr) return 0;
  read_pid(*w);
  return w->pid != 0 ? w->pid : w->shim_pid;
}

pid_t Supervisor::reported_pid(int local_rank) {
  Worker* w = find(local_rank);
  if (w == nullptr) return 0;
  read_pid(*w);
  return w->pid;
}

std::vector<int> Supervisor::running() const {
  std::vector<int> out;
  for (const auto& w : workers_) {
    if (!w->exited) out.push_back(w->local_rank);
  }
  return out;
}

Result<std::string> resolve_executable(const std::string& program, const std::string& path_env) {
  if (program.empty()) return invalid_argument("the training script is an empty string");
  if (program.find('/') != std::string::npos) {
    if (access(program.c_str(), F_OK) != 0) {
      return invalid_argument("cannot find the program '" + program + "': " + errno_text());
    }
    return program;
  }
  std::string dirs = path_env.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_env;
  std::size_t pos = 0;
  while (pos <= dirs.size()) {
    std::size_t colon = dirs.find(':', pos);
    std::string dir = dirs.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + program;
    struct stat st{};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return invalid_argument("cannot find '" + program + "' on PATH (" + dirs +
                          "); give its full path or install it");
}

}  // namespace muster::launcher
