// bench/allreduce: all_reduce (float32, sum) over libmuster's CPU backend,
// one line of JSON per size from rank 0: {"bytes", "seconds"} (the median of
// five batches of the slowest rank's mean time per call). "memcpy" as the only argument instead measures
// one process's memcpy bandwidth at each size (the ceiling), no launcher.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "muster/process_group.hpp"
#include "timing.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::size_t> sizes() {
  std::vector<std::size_t> s;
  for (std::size_t b = 4 << 10; b <= (64u << 20); b *= 4) s.push_back(b);
  return s;
}

int iterations(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((512u << 20) / bytes, 5, 2000));
}

int memcpy_bench() {
  for (std::size_t bytes : sizes()) {
    std::vector<char> a(bytes, 1), b(bytes, 0);
    int iters = iterations(bytes);
    std::memcpy(b.data(), a.data(), bytes);
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      a[i % bytes] = static_cast<char>(i);
      std::memcpy(b.data(), a.data(), bytes);
    }
    double s = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    std::printf("{\"bytes\": %zu, \"seconds\": %.9g, \"check\": %d}\n", bytes, s, b[bytes / 2]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "memcpy") return memcpy_bench();
  auto pg = muster::init_process_group();
  for (std::size_t bytes : sizes()) {
    std::vector<float> v(bytes / 4, 1.0f);
    int iters = std::max(1, iterations(bytes) / 5);
    double seconds = bench::median_of_slowest(pg, iters, [&] { pg.all_reduce(std::span<float>(v)); }, [] {});
    if (pg.rank() == 0) std::printf("{\"bytes\": %zu, \"seconds\": %.9g}\n", bytes, seconds);
    std::fflush(stdout);
  }
  muster::destroy_process_group();
  return 0;
}
