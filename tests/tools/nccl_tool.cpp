// The NCCL backend's check, one rank per GPU: all_reduce (sum, avg, max),
// broadcast, all_gather and reduce_scatter on device buffers, results copied
// back and compared. Exits 77 with "no GPU" when no CUDA device is visible.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "muster/nccl.hpp"

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: no CUDA device is visible\n");
    return 77;
  }
  try {
    auto pg = muster::init_process_group();
    muster::NcclCommunicator nccl(pg, pg.local_rank() % devices);
    const int n = pg.size(), r = pg.rank();
    const std::size_t count = 1 << 20;
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *a, *big;
    cudaMalloc(&a, count * sizeof(float));
    cudaMalloc(&big, count * n * sizeof(float));
    std::vector<float> host(count, static_cast<float>(r + 1)), back(count), all(count * n);
    int bad = 0;
    auto expect = [&](const std::vector<float>& v, std::size_t len, auto want, const char* what) {
      for (std::size_t i = 0; i < len; ++i)
        if (v[i] != want(i)) {
          std::fprintf(stderr, "rank %d: %s wrong at %zu: %g\n", r, what, i, v[i]);
          ++bad;
          return;
        }
    };
    cudaMemcpy(a, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    nccl.all_reduce(a, count, muster::DataType::float32, muster::ReduceOp::sum, s);
    nccl.synchronize(s);
    cudaMemcpy(back.data(), a, count * sizeof(float), cudaMemcpyDeviceToHost);
    expect(back, count, [&](std::size_t) { return n * (n + 1) / 2.0f; }, "all_reduce sum");
    cudaMemcpy(a, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    nccl.all_reduce(a, count, muster::DataType::float32, muster::ReduceOp::max, s);
    nccl.synchronize(s);
    cudaMemcpy(back.data(), a, count * sizeof(float), cudaMemcpyDeviceToHost);
    expect(back, count, [&](std::size_t) { return static_cast<float>(n); }, "all_reduce max");
    cudaMemcpy(a, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    nccl.broadcast(a, count, muster::DataType::float32, n - 1, s);
    nccl.synchronize(s);
    cudaMemcpy(back.data(), a, count * sizeof(float), cudaMemcpyDeviceToHost);
    expect(back, count, [&](std::size_t) { return static_cast<float>(n); }, "broadcast");
    cudaMemcpy(a, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    nccl.all_gather(a, big, count, muster::DataType::float32, s);
    nccl.synchronize(s);
    cudaMemcpy(all.data(), big, count * n * sizeof(float), cudaMemcpyDeviceToHost);
    expect(all, count * n, [&](std::size_t i) { return static_cast<float>(i / count + 1); }, "all_gather");
    nccl.reduce_scatter(big, a, count, muster::DataType::float32, muster::ReduceOp::sum, s);
    nccl.synchronize(s);
    cudaMemcpy(back.data(), a, count * sizeof(float), cudaMemcpyDeviceToHost);
    expect(back, count, [&](std::size_t) { return static_cast<float>(n * (r + 1)); }, "reduce_scatter");
    cudaFree(a);
    cudaFree(big);
    if (bad) return 1;
    std::printf("nccl ok rank=%d size=%d\n", r, n);
    muster::destroy_process_group();
    return 0;
  } catch (const muster::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
