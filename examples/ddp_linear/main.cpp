// ddp_linear: a linear model trained data-parallel on the CPU with libmuster.
//
//   muster  --standalone --nproc-per-node=2 --no-python build/examples/ddp_linear/ddp_linear OUT_DIR
//   torchrun --standalone --nproc-per-node=2 --no-python build/examples/ddp_linear/ddp_linear OUT_DIR
//
// Every rank builds the same synthetic regression dataset, takes its share of
// each epoch through DistributedSampler (reshuffled by set_epoch), computes
// the mean-squared-error gradient on its batches and averages it over the
// ranks with all_reduce. Rank 0 writes OUT_DIR/checkpoint.txt; at the end
// every rank checks that its weights equal rank 0's, bit for bit.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "muster/muster.hpp"

namespace {

constexpr int kFeatures = 8;
constexpr std::size_t kSamples = 4096;
constexpr std::size_t kBatch = 32;
constexpr float kLearningRate = 0.05f;

// A small deterministic generator: the same dataset on every rank.
struct Lcg {
  uint64_t s;
  float next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
  }
};

struct Dataset {
  std::vector<float> x;  // kSamples x kFeatures
  std::vector<float> y;
};

Dataset make_dataset() {
  Dataset d;
  Lcg g{42};
  float true_w[kFeatures];
  for (float& w : true_w) w = g.next() * 3.0f;
  const float true_b = 0.5f;
  d.x.resize(kSamples * kFeatures);
  d.y.resize(kSamples);
  for (std::size_t i = 0; i < kSamples; ++i) {
    float y = true_b;
    for (int f = 0; f < kFeatures; ++f) {
      float v = g.next();
      d.x[i * kFeatures + f] = v;
      y += true_w[f] * v;
    }
    d.y[i] = y + 0.01f * g.next();
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ddp_linear OUT_DIR [EPOCHS]\n");
    return 2;
  }
  const std::string out_dir = argv[1];
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 5;
  try {
    auto pg = muster::init_process_group();
    const int rank = pg.rank();
    const Dataset data = make_dataset();
    muster::DistributedSampler sampler(kSamples, pg, {.shuffle = true, .seed = 0, .drop_last = false});

    std::vector<float> params(kFeatures + 1, 0.0f);  // weights, then the bias
    std::vector<float> grad(kFeatures + 1);
    for (int epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      auto indices = sampler.indices();
      double loss_sum = 0;
      std::size_t seen = 0;
      for (std::size_t start = 0; start < indices.size(); start += kBatch) {
        std::size_t end = std::min(indices.size(), start + kBatch);
        std::fill(grad.begin(), grad.end(), 0.0f);
        for (std::size_t k = start; k < end; ++k) {
          std::size_t i = indices[k];
          const float* x = &data.x[i * kFeatures];
          float pred = params[kFeatures];
          for (int f = 0; f < kFeatures; ++f) pred += params[f] * x[f];
          float err = pred - data.y[i];
          loss_sum += static_cast<double>(err) * err;
          for (int f = 0; f < kFeatures; ++f) grad[f] += 2.0f * err * x[f];
          grad[kFeatures] += 2.0f * err;
        }
        const float n = static_cast<float>(end - start);
        for (float& g : grad) g /= n;
        seen += end - start;
        // The data-parallel step: every rank applies the same averaged gradient.
        pg.all_reduce(std::span<float>(grad), muster::ReduceOp::avg);
        for (int p = 0; p <= kFeatures; ++p) params[p] -= kLearningRate * grad[p];
      }
      double loss[2] = {loss_sum, static_cast<double>(seen)};
      pg.all_reduce(std::span<double>(loss, 2), muster::ReduceOp::sum);
      if (rank == 0) std::printf("epoch %d: mean squared error %.6f\n", epoch, loss[0] / loss[1]);
    }

    // Every rank holds rank 0's weights, bit for bit.
    std::vector<float> reference = params;
    pg.broadcast(std::span<float>(reference), 0);
    int32_t mismatch = std::memcmp(reference.data(), params.data(), params.size() * sizeof(float)) != 0;
    pg.all_reduce(std::span<int32_t>(&mismatch, 1), muster::ReduceOp::max);
    if (mismatch != 0) {
      std::fprintf(stderr, "rank %d: the ranks' weights differ\n", rank);
      return 1;
    }
    if (rank == 0) {
      std::ofstream ck(out_dir + "/checkpoint.txt");
      ck.precision(9);
      ck << "world_size " << pg.size() << "\nepochs " << epochs << "\n";
      for (int p = 0; p <= kFeatures; ++p) ck << (p < kFeatures ? "w" + std::to_string(p) : std::string("b")) << " " << params[p] << "\n";
      if (!ck) {
        std::fprintf(stderr, "rank 0: cannot write %s/checkpoint.txt\n", out_dir.c_str());
        return 1;
      }
      std::printf("rank 0 saved %s/checkpoint.txt; all %d ranks hold the same weights\n", out_dir.c_str(), pg.size());
    }
    muster::destroy_process_group();
    return 0;
  } catch (const muster::Error& e) {
    std::fprintf(stderr, "ddp_linear: %s\n", e.what());
    return 1;
  }
}
