// ddp_cuda: ddp_linear's model with its gradients averaged on the GPU by
// NCCL (one rank per GPU):
//   muster --standalone --nproc-per-node=gpu --no-python build/examples/ddp_cuda/ddp_cuda OUT_DIR
// Each rank computes its batch gradient on the host, copies it to its device,
// all-reduces it there with NCCL on its own stream, and copies it back; at the
// end every rank checks that its weights equal rank 0's.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "muster/muster.hpp"
#include "muster/nccl.hpp"

namespace {
constexpr int kFeatures = 8;
constexpr std::size_t kSamples = 4096;
constexpr std::size_t kBatch = 32;

struct Lcg {
  uint64_t s;
  float next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
  }
};

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw muster::Error(std::string("ddp_cuda: ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ddp_cuda OUT_DIR [EPOCHS]\n");
    return 2;
  }
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 3;
  try {
    auto pg = muster::init_process_group();
    muster::NcclCommunicator nccl(pg);
    cudaStream_t stream;
    cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    float* dev_grad = nullptr;
    cuda(cudaMalloc(&dev_grad, (kFeatures + 1) * sizeof(float)), "cudaMalloc");

    Lcg g{42};
    float true_w[kFeatures];
    for (float& w : true_w) w = g.next() * 3.0f;
    std::vector<float> x(kSamples * kFeatures), y(kSamples);
    for (std::size_t i = 0; i < kSamples; ++i) {
      y[i] = 0.5f;
      for (int f = 0; f < kFeatures; ++f) {
        x[i * kFeatures + f] = g.next();
        y[i] += true_w[f] * x[i * kFeatures + f];
      }
    }
    muster::DistributedSampler sampler(kSamples, pg);
    std::vector<float> params(kFeatures + 1, 0.0f), grad(kFeatures + 1);
    for (int epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      auto idx = sampler.indices();
      for (std::size_t s = 0; s < idx.size(); s += kBatch) {
        std::size_t e = std::min(idx.size(), s + kBatch);
        std::fill(grad.begin(), grad.end(), 0.0f);
        for (std::size_t k = s; k < e; ++k) {
          const float* xi = &x[idx[k] * kFeatures];
          float err = params[kFeatures] - y[idx[k]];
          for (int f = 0; f < kFeatures; ++f) err += params[f] * xi[f];
          for (int f = 0; f < kFeatures; ++f) grad[f] += 2.0f * err * xi[f] / (e - s);
          grad[kFeatures] += 2.0f * err / (e - s);
        }
        cuda(cudaMemcpyAsync(dev_grad, grad.data(), grad.size() * sizeof(float), cudaMemcpyHostToDevice, stream), "copy in");
        nccl.all_reduce(dev_grad, grad.size(), muster::DataType::float32, muster::ReduceOp::avg, stream);
        cuda(cudaMemcpyAsync(grad.data(), dev_grad, grad.size() * sizeof(float), cudaMemcpyDeviceToHost, stream), "copy out");
        nccl.synchronize(stream);
        for (int p = 0; p <= kFeatures; ++p) params[p] -= 0.05f * grad[p];
      }
    }
    std::vector<float> ref = params;
    pg.broadcast(std::span<float>(ref), 0);
    if (std::memcmp(ref.data(), params.data(), ref.size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "rank %d: weights differ from rank 0's\n", pg.rank());
      return 1;
    }
    if (pg.rank() == 0) {
      std::ofstream(std::string(argv[1]) + "/checkpoint.txt") << "bias " << params[kFeatures] << "\n";
      std::printf("rank 0 saved %s/checkpoint.txt; all %d ranks hold the same weights\n", argv[1], pg.size());
    }
    cudaFree(dev_grad);
    cudaStreamDestroy(stream);
    muster::destroy_process_group();
    return 0;
  } catch (const muster::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
