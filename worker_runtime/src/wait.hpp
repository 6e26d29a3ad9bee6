// Bounded waiting for the collectives: spin briefly, then yield, then sleep
// with backoff; every 10 ms the caller's check runs (a peer gone, the group
// aborted) and throws. Nothing here makes a system call while the condition
// comes true within the first microseconds.
#pragma once

#include <sched.h>
#include <time.h>

#include <chrono>
#include <string>

#include "muster/process_group.hpp"

namespace muster::detail {

using Clock = std::chrono::steady_clock;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// ready() -> bool; check() throws muster::Error when waiting is pointless.
// what() names the wait in the timeout message (built only on a timeout).
// spins: how many pause instructions before the first yield (0 when the
// waiters outnumber the cores: spinning would only delay the peer it waits for).
template <typename Ready, typename Check, typename What>
void wait_until(Ready&& ready, Check&& check, Clock::time_point deadline, What&& what, int spins = 2048) {
  for (int i = 0; i < spins; ++i) {
    if (ready()) return;
    cpu_relax();
  }
  const auto start = Clock::now();
  auto next_check = start;
  long sleep_ns = 20000;
  while (true) {
    if (ready()) return;
    auto now = Clock::now();
    if (now >= next_check) {
      check();
      next_check = now + std::chrono::milliseconds(10);
    }
    if (now >= deadline) {
      if (ready()) return;
      throw TimeoutError(what());
    }
    if (now - start < std::chrono::milliseconds(2)) {
      sched_yield();
    } else {
      timespec ts{0, sleep_ns};
      nanosleep(&ts, nullptr);
      sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
    }
  }
}

}  // namespace muster::detail
