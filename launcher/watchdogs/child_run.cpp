#include "child_run.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <csignal>
#include <cstring>

namespace muster::launcher {
namespace {

// How often a run whose output ended is looked at until it has exited, and
// how long past the limit before it is given up on (a process stuck in the
// kernel, which even SIGKILL does not end at once).
constexpr std::chrono::milliseconds kReapEvery{20};
constexpr std::chrono::milliseconds kReapGrace{1000};

}  // namespace

struct ChildRun::State {
  State(boost::asio::io_context& io, Spec spec, Done done)
      : io(io), spec(std::move(spec)), done(std::move(done)), pipe(io), limit_timer(io), reap_timer(io) {}
  boost::asio::io_context& io;
  Spec spec;
  Done done;
  boost::asio::posix::stream_descriptor pipe;
  boost::asio::steady_timer limit_timer;
  boost::asio::steady_timer reap_timer;
  std::array<char, 16384> buf{};
  pid_t pid = -1;
  std::chrono::steady_clock::time_point until{};
  Outcome outcome;
  bool ended = false;      // reaped, given up, or never started
  bool abandoned = false;
};

std::string ChildRun::Outcome::how() const {
  if (!started) return "not started: " + error;
  if (given_up) return "still there past the limit, given up";
  if (timed_out) return "killed at the limit";
  if (signal != 0) return "killed by signal " + std::to_string(signal);
  return "exit " + std::to_string(exit_code);
}

ChildRun::ChildRun(boost::asio::io_context& io, Spec spec, Done done)
    : s_(std::make_unique<State>(io, std::move(spec), std::move(done))) {}

std::shared_ptr<ChildRun> ChildRun::start(boost::asio::io_context& io, Spec spec, Done done) {
  auto run = std::make_shared<ChildRun>(io, std::move(spec), std::move(done));
  run->launch();
  return run;
}

ChildRun::~ChildRun() { abandon(); }

void ChildRun::abandon() {
  if (s_->abandoned) return;
  s_->abandoned = true;
  s_->done = nullptr;
  if (s_->pid > 0 && !s_->ended) {
    // The intermediate kills the command's group at once and exits: the wait is short.
    ::kill(s_->pid, SIGTERM);
    ::waitpid(s_->pid, nullptr, 0);
    s_->ended = true;
  }
  boost::system::error_code ignored;
  s_->limit_timer.cancel();
  s_->reap_timer.cancel();
  s_->pipe.close(ignored);
}

void ChildRun::launch() {
  State& s = *s_;
  auto fail = [&](const std::string& why) {
    s.outcome.error = why;
    s.ended = true;
    finish();
  };
  if (s.spec.argv.empty()) return fail("no program");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return fail(std::string("pipe: ") + std::strerror(errno));
  // Everything the child touches is laid out before the fork: the agent has
  // threads, so the child may only make system calls until execve.
  std::vector<char*> argv;
  for (auto& a : s.spec.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  if (s.spec.envp) {
    for (auto& e : *s.spec.envp) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
  char** env = s.spec.envp ? envp.data() : environ;
  sigset_t none;
  sigemptyset(&none);
  sigset_t watched;  // the intermediate's: its command ended, or the agent died
  sigemptyset(&watched);
  sigaddset(&watched, SIGCHLD);
  sigaddset(&watched, SIGTERM);
  const pid_t agent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The intermediate: leads a process group of its own, runs the command
    // in a group of the command's own, and outlives it only to say how it
    // ended. On SIGTERM (the agent's limit, or its death through
    // PR_SET_PDEATHSIG, even a SIGKILL) it kills the command's whole group
    // first; when the command exits it kills what the command left running
    // (so nothing holds the output pipe or outlives the agent).
    ::setpgid(0, 0);
    ::sigprocmask(SIG_BLOCK, &watched, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != agent) ::_exit(126);  // the agent is already gone
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    // Nothing of the agent's (its sockets, the workers' control sockets) is
    // held here: this process never execs, so O_CLOEXEC would not close them.
    ::syscall(SYS_close_range, 3U, ~0U, 0U);
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 34)
    const pid_t command = ::_Fork();  // no fork handlers in a child of a threaded process
#else
    const pid_t command = ::fork();
#endif
    if (command == 0) {
      ::setpgid(0, 0);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig = 1; sig < NSIG; ++sig) {
        if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &dfl, nullptr);  // the agent ignores SIGPIPE
      }
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execve(argv[0], argv.data(), env);
      ::_exit(127);
    }
    if (command < 0) ::_exit(126);
    ::setpgid(command, command);  // either side may get there first
    for (;;) {
      siginfo_t info;
      if (::sigwaitinfo(&watched, &info) < 0) continue;
      if (info.si_signo == SIGTERM) {
        ::kill(-command, SIGKILL);
        ::_exit(137);
      }
      int status = 0;
      if (::waitpid(command, &status, WNOHANG) != command) continue;
      ::kill(-command, SIGKILL);  // what it left running in its group
      if (WIFSIGNALED(status)) ::_exit(128 + WTERMSIG(status));
      ::_exit(WEXITSTATUS(status));
    }
  }
  if (pid > 0) ::setpgid(pid, pid);  // either side may get there first
  const int fork_errno = errno;
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return fail(std::string("fork: ") + std::strerror(fork_errno));
  }
  s.pid = pid;
  s.outcome.started = true;
  s.pipe.assign(fds[0]);
  s.until = std::chrono::steady_clock::now() + s.spec.limit;
  auto self = shared_from_this();
  s.limit_timer.expires_at(s.until);
  s.limit_timer.async_wait([self](const boost::system::error_code& ec) {
    if (ec || self->s_->abandoned || self->s_->ended) return;
    self->s_->outcome.timed_out = true;
    ::kill(self->s_->pid, SIGTERM);  // the intermediate kills the command's group, then exits
  });
  read_more();
}

void ChildRun::read_more() {
  auto self = shared_from_this();
  s_->pipe.async_read_some(boost::asio::buffer(s_->buf), [self](const boost::system::error_code& ec, std::size_t n) {
    State& s = *self->s_;
    if (s.abandoned) return;
    if (n > 0) {
      std::string& out = s.outcome.output;
      out.append(s.buf.data(), n);
      if (out.size() > s.spec.max_output) {
        s.outcome.output_cut = true;
        if (s.spec.keep == Keep::head) out.resize(s.spec.max_output);
        else out.erase(0, out.size() - s.spec.max_output);
      }
    }
    if (ec) return self->reap();
    self->read_more();
  });
}

// Its output has ended: reaped as soon as it has exited, without waiting on the loop.
void ChildRun::reap() {
  State& s = *s_;
  int status = 0;
  const pid_t r = ::waitpid(s.pid, &status, WNOHANG);
  if (r == 0 && std::chrono::steady_clock::now() < s.until + kReapGrace) {
    auto self = shared_from_this();
    s.reap_timer.expires_after(kReapEvery);
    s.reap_timer.async_wait([self](const boost::system::error_code& ec) {
      if (!ec && !self->s_->abandoned) self->reap();
    });
    return;
  }
  if (r == s.pid && WIFEXITED(status)) {
    s.outcome.exit_code = WEXITSTATUS(status);
  } else if (r == s.pid && WIFSIGNALED(status)) {
    s.outcome.signal = WTERMSIG(status);
  } else if (r == 0) {
    ::kill(s.pid, SIGKILL);
    s.outcome.given_up = true;
  }
  s.ended = true;
  finish();
}

void ChildRun::finish() {
  State& s = *s_;
  boost::system::error_code ignored;
  s.limit_timer.cancel();
  s.pipe.close(ignored);
  if (!s.done) return;
  // On the loop, never inside start(): the caller's state is settled first.
  boost::asio::post(s.io, [done = std::move(s.done), outcome = s.outcome]() mutable { done(std::move(outcome)); });
  s.done = nullptr;
}

}  // namespace muster::launcher
