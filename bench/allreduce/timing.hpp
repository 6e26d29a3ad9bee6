// What the all_reduce benches time, the same way for every backend: after a
// warm-up, five timed batches of `iters` calls; each batch's figure is the
// slowest rank's mean time per call; the median batch decides (2 cores: one
// noisy batch must not). `call()` issues one all_reduce, `finish()` waits for
// the batch's work (a GPU stream; nothing on the CPU).
#pragma once

#include <algorithm>
#include <chrono>
#include <span>
#include <vector>

#include "muster/process_group.hpp"

namespace bench {

template <class Call, class Finish>
double median_of_slowest(muster::ProcessGroup& pg, int iters, Call call, Finish finish) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < std::min(iters, 20); ++i) call();
  finish();
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    pg.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) call();
    finish();
    double mine = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    pg.all_reduce(std::span<double>(&mine, 1), muster::ReduceOp::max);
    batches.push_back(mine);
  }
  std::sort(batches.begin(), batches.end());
  return batches[2];
}

}  // namespace bench
