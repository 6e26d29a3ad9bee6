// The Python stacks of every worker at the moment one is taken for hung
// (--worker-timeout, an expired file timer), before anything is killed
// (docs/hangs.md): `py-spy dump --pid` of each worker, all at once, each a
// ChildRun (a child of the agent that dies with it, read on the event loop
// without blocking it) bounded in time: what is not done by the limit is
// killed and marked so. The workers allow the dump where Yama
// restricts ptrace: the shim sets PR_SET_PTRACER to the agent before exec,
// which lets the agent's children attach.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "child_run.hpp"

namespace muster::launcher {

// The most of one dump's output that is kept.
constexpr std::size_t kMaxStackBytes = 1 << 20;

class StackDump {
 public:
  struct Target {
    int local_rank = 0;
    int global_rank = 0;
    pid_t pid = 0;
  };
  struct Stack {
    Target target;
    std::string text;        // py-spy's output, stdout and stderr together
    bool complete = false;   // py-spy exited 0 before the limit
    std::string how_it_ended;  // "exit 0", "exit 1", "killed at the limit", ...
  };
  using Done = std::function<void(std::vector<Stack>)>;

  // py_spy: the program's path, "" when there is none (then available() is false).
  StackDump(boost::asio::io_context& io, std::string py_spy, std::chrono::milliseconds limit);
  ~StackDump();
  StackDump(const StackDump&) = delete;
  StackDump& operator=(const StackDump&) = delete;

  bool available() const { return !py_spy_.empty(); }
  const std::string& program() const { return py_spy_; }
  bool running() const { return batch_ != nullptr; }
  // Dumps every target at once; done runs on the loop once all have ended or
  // the limit has passed. A dump already running: refused (false).
  bool dump(std::vector<Target> targets, Done done);

 private:
  struct Batch {
    std::vector<Stack> stacks;
    std::vector<std::shared_ptr<ChildRun>> runs;
    std::size_t open = 0;
    Done done;
  };

  boost::asio::io_context& io_;
  std::string py_spy_;
  std::chrono::milliseconds limit_;
  std::shared_ptr<Batch> batch_;
};

}  // namespace muster::launcher
