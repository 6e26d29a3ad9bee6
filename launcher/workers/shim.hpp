// The shim: a forked copy of the agent that sits between the agent and one
// worker so that nothing outlives the agent.
//
// Contract:
//  * It is a child subreaper: every orphan below the worker is re-parented to it.
//  * The worker runs in a new session (its PGID is its PID), like torchrun's.
//  * The control socket (datagrams) carries the worker's PID (4 bytes) to the
//    agent, then, when the worker has exited, the wall-clock time the shim saw
//    it end (8 bytes, microseconds since the epoch) before any clean-up of its
//    own; and signal numbers (1 byte each) from the agent; each is sent to the worker's
//    process group. End-of-file on it means the agent is gone: the shim kills
//    the worker's group and every descendant it has adopted, then exits.
//  * When the worker exits, the shim kills what is left of its group and its
//    adopted descendants, and exits with the worker's status (the same exit
//    code, or death by the same signal), so the agent reads the worker's fate
//    from the shim's pidfd.
//  * The copy allocates nothing and takes no lock: another of the agent's
//    threads may have held one (the heap's, a sanitizer's) at the fork, and in
//    the copy nobody would ever release it. Everything the copy reads is made
//    before the fork (PreparedShim); it calls the kernel through libc's thin
//    wrappers (a raw syscall where a sanitizer's wrapper would lock), and forks
//    the worker with _Fork, which runs no pthread_atfork handlers.
#pragma once

#include <string>
#include <vector>

namespace muster::launcher {

struct ShimSpec {
  int control_fd = -1;
  int stdout_fd = -1;  // -1: inherit the agent's
  int stderr_fd = -1;
  std::string path;                // resolved executable
  std::vector<std::string> argv;   // argv[0] included
  std::vector<std::string> envp;   // KEY=VALUE
  // sched_setaffinity's mask for the worker, applied before exec so that the
  // worker and all it starts inherit it (empty: the agent's affinity).
  std::vector<unsigned long> cpu_mask;
};

// A ShimSpec with argv and envp laid out as the NULL-ended arrays execve
// takes. Made in the agent before the fork: the forked copy must not allocate.
// The arrays point into `spec`, so it is neither copied nor moved.
struct PreparedShim {
  explicit PreparedShim(ShimSpec s);
  PreparedShim(const PreparedShim&) = delete;
  PreparedShim& operator=(const PreparedShim&) = delete;

  ShimSpec spec;
  std::vector<char*> argv;
  std::vector<char*> envp;
};

// Runs in the child right after fork(), with all signals blocked. Never returns.
[[noreturn]] void run_shim(const PreparedShim& shim);

}  // namespace muster::launcher
