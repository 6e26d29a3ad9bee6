// bench/allreduce: all_reduce (float32, sum) on GPU buffers through
// libmuster's NCCL backend, one rank per GPU. Rank 0 prints one JSON line per
// size: {"bytes", "seconds"}, the median of five batches of the slowest rank's
// mean time per call (timing.hpp), as nccl_torch.py does for torch on NCCL.
// Exits 77 with "no GPU" when no CUDA device is visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "muster/nccl.hpp"
#include "timing.hpp"

namespace {

// 4 KiB to 1 GiB by fours, or up to MUSTER_BENCH_MAX_BYTES.
std::vector<std::size_t> sizes() {
  std::size_t top = std::size_t{1} << 30;
  if (const char* m = std::getenv("MUSTER_BENCH_MAX_BYTES")) top = std::strtoull(m, nullptr, 10);
  std::vector<std::size_t> s;
  for (std::size_t b = 4 << 10; b <= top; b *= 4) s.push_back(b);
  return s;
}

int iterations(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{8} << 30) / bytes, 5, 500));
}

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "nccl_bench: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: no CUDA device is visible\n");
    return 77;
  }
  try {
    auto pg = muster::init_process_group();
    muster::NcclCommunicator nccl(pg, pg.local_rank() % devices);
    cudaStream_t stream;
    if (!check(cudaStreamCreate(&stream), "cudaStreamCreate")) return 1;
    for (std::size_t bytes : sizes()) {
      void* buf = nullptr;
      if (!check(cudaMalloc(&buf, bytes), "cudaMalloc")) return 1;
      cudaMemset(buf, 0, bytes);
      std::size_t count = bytes / sizeof(float);
      int iters = std::max(1, iterations(bytes) / 5);
      double seconds = bench::median_of_slowest(
          pg, iters, [&] { nccl.all_reduce(buf, count, muster::DataType::float32, muster::ReduceOp::sum, stream); },
          [&] { nccl.synchronize(stream); });
      if (pg.rank() == 0) std::printf("{\"bytes\": %zu, \"seconds\": %.9g}\n", bytes, seconds);
      std::fflush(stdout);
      cudaFree(buf);
    }
    cudaStreamDestroy(stream);
    muster::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
