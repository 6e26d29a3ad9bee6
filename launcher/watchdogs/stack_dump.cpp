#include "stack_dump.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <csignal>
#include <cstring>

namespace muster::launcher {
namespace {

// How often a dump whose output ended is looked at until it has exited, and
// how long past the limit before it is given up on (a process stuck in the
// kernel, which even SIGKILL does not end at once).
constexpr std::chrono::milliseconds kReapEvery{20};
constexpr std::chrono::milliseconds kReapGrace{1000};

}  // namespace

struct StackDump::Child {
  explicit Child(boost::asio::io_context& io) : pipe(io), reap_timer(io) {}
  pid_t pid = -1;
  boost::asio::posix::stream_descriptor pipe;
  boost::asio::steady_timer reap_timer;
  std::array<char, 16384> buf{};
  bool ended = false;
};

struct StackDump::Batch {
  Batch(boost::asio::io_context& io, std::chrono::steady_clock::time_point until) : deadline(io), until(until) {}
  std::vector<std::unique_ptr<Child>> children;
  std::vector<Stack> stacks;
  Done done;
  boost::asio::steady_timer deadline;
  std::chrono::steady_clock::time_point until;
  bool past_limit = false;
  bool cancelled = false;  // the StackDump is gone: nothing more is done
  std::size_t open = 0;    // children not yet ended
};

StackDump::StackDump(boost::asio::io_context& io, std::string py_spy, std::chrono::milliseconds limit)
    : io_(io), py_spy_(std::move(py_spy)), limit_(limit) {}

StackDump::~StackDump() {
  if (!batch_) return;
  batch_->cancelled = true;
  for (auto& c : batch_->children) {
    if (c->pid > 0 && !c->ended) {
      ::kill(c->pid, SIGKILL);
      ::waitpid(c->pid, nullptr, 0);
    }
  }
}

bool StackDump::dump(std::vector<Target> targets, Done done) {
  if (batch_ || !available()) return false;
  auto b = std::make_shared<Batch>(io_, std::chrono::steady_clock::now() + limit_);
  b->done = std::move(done);
  for (const auto& t : targets) {
    Stack s;
    s.target = t;
    b->stacks.push_back(std::move(s));
    b->children.push_back(std::make_unique<Child>(io_));
  }
  batch_ = b;
  b->open = targets.size();
  for (std::size_t i = 0; i < targets.size(); ++i) start_child(*b, i);
  b->deadline.expires_at(b->until);
  b->deadline.async_wait([this, b](const boost::system::error_code& ec) {
    if (ec || b->cancelled) return;
    b->past_limit = true;
    for (auto& c : b->children) {
      if (c->pid > 0 && !c->ended) ::kill(c->pid, SIGKILL);
    }
  });
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (b->children[i]->pid > 0) read_more(b, i);
  }
  finish_if_done(b);
  return true;
}

void StackDump::start_child(Batch& b, std::size_t index) {
  Stack& stack = b.stacks[index];
  Child& child = *b.children[index];
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    stack.how_it_ended = std::string("not started: pipe: ") + std::strerror(errno);
    child.ended = true;
    --b.open;
    return;
  }
  // Everything the child touches is laid out before the fork: the agent has
  // threads, so the child may only make system calls until execv.
  const std::string pid_text = std::to_string(stack.target.pid);
  std::vector<char*> argv{const_cast<char*>(py_spy_.c_str()), const_cast<char*>("dump"),
                          const_cast<char*>("--pid"), const_cast<char*>(pid_text.c_str()), nullptr};
  sigset_t none;
  sigemptyset(&none);
  const pid_t agent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != agent) ::_exit(1);  // the agent is already gone
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    stack.how_it_ended = std::string("not started: fork: ") + std::strerror(fork_errno);
    child.ended = true;
    --b.open;
    return;
  }
  child.pid = pid;
  child.pipe.assign(fds[0]);
}

void StackDump::read_more(const std::shared_ptr<Batch>& b, std::size_t index) {
  Child& c = *b->children[index];
  c.pipe.async_read_some(boost::asio::buffer(c.buf), [this, b, index](const boost::system::error_code& ec,
                                                                      std::size_t n) {
    if (b->cancelled) return;
    Child& child = *b->children[index];
    std::string& text = b->stacks[index].text;
    if (n > 0 && text.size() < kMaxStackBytes) text.append(child.buf.data(), std::min(n, kMaxStackBytes - text.size()));
    if (ec) return child_ended(b, index);
    read_more(b, index);
  });
}

// Its output has ended: reaped as soon as it has exited, without waiting on the loop.
void StackDump::child_ended(const std::shared_ptr<Batch>& b, std::size_t index) {
  Child& c = *b->children[index];
  Stack& s = b->stacks[index];
  int status = 0;
  pid_t r = ::waitpid(c.pid, &status, WNOHANG);
  if (r == 0 && std::chrono::steady_clock::now() < b->until + kReapGrace) {
    c.reap_timer.expires_after(kReapEvery);
    c.reap_timer.async_wait([this, b, index](const boost::system::error_code& ec) {
      if (!ec && !b->cancelled) child_ended(b, index);
    });
    return;
  }
  if (r == c.pid && WIFEXITED(status)) {
    s.complete = WEXITSTATUS(status) == 0 && !b->past_limit;
    s.how_it_ended = WEXITSTATUS(status) == 127 ? "py-spy could not be run" : "exit " + std::to_string(WEXITSTATUS(status));
  } else if (r == c.pid) {
    s.how_it_ended = b->past_limit ? "killed at the limit" : "killed by signal " + std::to_string(WTERMSIG(status));
  } else {
    s.how_it_ended = "still there past the limit, given up";
  }
  if (s.text.size() >= kMaxStackBytes) s.how_it_ended += ", output cut at " + std::to_string(kMaxStackBytes) + " bytes";
  c.ended = true;
  --b->open;
  finish_if_done(b);
}

void StackDump::finish_if_done(const std::shared_ptr<Batch>& b) {
  if (b->open > 0 || b->cancelled || batch_ != b) return;
  b->deadline.cancel();
  batch_.reset();
  auto done = std::move(b->done);
  auto stacks = std::move(b->stacks);
  // On the loop, not inside dump(): the caller's state is settled first.
  boost::asio::post(io_, [done = std::move(done), stacks = std::move(stacks)]() mutable { done(std::move(stacks)); });
}

}  // namespace muster::launcher
