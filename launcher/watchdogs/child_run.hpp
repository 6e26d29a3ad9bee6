// One helper process of the agent (a health check, a stack dump): started
// with fork and execve from an argv and environment laid out before the fork
// (the agent has threads), under a small intermediate process that holds
// none of the agent's descriptors, runs the command in a process group of
// its own with default signal dispositions, and kills that whole group when
// the agent dies (PR_SET_PDEATHSIG: even a SIGKILLed agent leaves nothing of
// it behind), at the limit, and once the command exits (what it left running
// goes too); a command killed by signal N is reported as exit 128+N; its stdout and stderr read together on the event
// loop without blocking it (the first or the last max_output bytes kept);
// killed with its group at the limit; reaped without waiting on the loop.
// `done` runs once, on the loop, unless the run was abandoned.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace muster::launcher {

class ChildRun : public std::enable_shared_from_this<ChildRun> {
 public:
  enum class Keep { head, tail };
  struct Outcome {
    bool started = false;
    int exit_code = -1;      // when it exited
    int signal = 0;          // when a signal ended it
    bool timed_out = false;  // killed at the limit
    bool given_up = false;   // still there past the limit and its grace: not reaped
    std::string output;      // stdout and stderr together, cut to max_output
    bool output_cut = false;
    std::string error;       // why it did not start
    bool ok() const { return started && !timed_out && signal == 0 && exit_code == 0; }
    // "exit 0", "exit 3", "killed by signal 9", "killed at the limit", "not started: ...".
    std::string how() const;
  };
  using Done = std::function<void(Outcome)>;

  struct Spec {
    std::vector<std::string> argv;                  // argv[0]: the program's path
    std::optional<std::vector<std::string>> envp;   // none: the agent's
    std::chrono::milliseconds limit{10000};
    std::size_t max_output = 64 * 1024;
    Keep keep = Keep::head;
  };

  static std::shared_ptr<ChildRun> start(boost::asio::io_context& io, Spec spec, Done done);
  ~ChildRun();
  // For an owner going away: kills it now, reaps it, and runs no callback.
  void abandon();

  ChildRun(boost::asio::io_context& io, Spec spec, Done done);  // through start()

 private:
  struct State;
  void launch();
  void read_more();
  void reap();
  void finish();

  std::unique_ptr<State> s_;
};

}  // namespace muster::launcher
