#include "muster/sampler.hpp"

#include "muster/process_group.hpp"

#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace muster {

namespace {

// Above this size torch (from about 2.7 on) draws 64-bit numbers in an
// inside-out shuffle, so that the modulo bias of 32-bit draws stays small.
constexpr int64_t kRandperm64BitThreshold = 214748364;  // UINT32_MAX / 20

}  // namespace

std::vector<int64_t> randperm(int64_t n, uint64_t seed) {
  if (n < 0) throw Error("randperm: n must be non-negative, got " + std::to_string(n));
  std::vector<int64_t> r(static_cast<std::size_t>(n));
  std::mt19937 engine(static_cast<uint32_t>(seed & 0xffffffffULL));
  if (n < kRandperm64BitThreshold) {
    std::iota(r.begin(), r.end(), int64_t{0});
    for (int64_t i = 0; i + 1 < n; ++i) {
      auto z = static_cast<int64_t>(static_cast<uint32_t>(engine()) % static_cast<uint64_t>(n - i));
      std::swap(r[static_cast<std::size_t>(i)], r[static_cast<std::size_t>(i + z)]);
    }
    return r;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint64_t hi = static_cast<uint32_t>(engine());
    uint64_t lo = static_cast<uint32_t>(engine());
    uint64_t draw = (hi << 32) | lo;
    auto z = static_cast<int64_t>(draw % static_cast<uint64_t>(i + 1));
    r[static_cast<std::size_t>(i)] = r[static_cast<std::size_t>(z)];
    r[static_cast<std::size_t>(z)] = i;
  }
  return r;
}

DistributedSampler::DistributedSampler(std::size_t dataset_size, const ProcessGroup& group, SamplerOptions options)
    : DistributedSampler(dataset_size, group.size(), group.rank(), options) {}

DistributedSampler::DistributedSampler(std::size_t dataset_size, int num_replicas, int rank, SamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  if (num_replicas < 1) {
    throw Error("DistributedSampler: num_replicas must be at least 1, got " +
                                std::to_string(num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw Error("Invalid rank " + std::to_string(rank) + ", rank should be in the interval [0, " +
                                std::to_string(num_replicas - 1) + "]");
  }
  auto r = static_cast<std::size_t>(num_replicas);
  if (options.drop_last && dataset_size % r != 0) {
    num_samples_ = dataset_size / r;  // torch's ceil((L - R) / R), which is floor(L / R) here
  } else {
    num_samples_ = (dataset_size + r - 1) / r;
  }
  total_size_ = num_samples_ * r;
}

std::vector<std::size_t> DistributedSampler::indices() const {
  std::vector<std::size_t> out;
  out.reserve(num_samples_);
  if (dataset_size_ == 0 || num_samples_ == 0) return out;
  std::vector<int64_t> perm;
  if (options_.shuffle) {
    // Python adds seed and epoch as unbounded integers; the generator keeps
    // the low 32 bits, which wrap-around addition preserves.
    uint64_t seed = static_cast<uint64_t>(options_.seed) + static_cast<uint64_t>(epoch_);
    perm = randperm(static_cast<int64_t>(dataset_size_), seed);
  }
  auto at = [&](std::size_t k) -> std::size_t {
    std::size_t i = k % dataset_size_;  // padding repeats from the front
    return options_.shuffle ? static_cast<std::size_t>(perm[i]) : i;
  };
  for (std::size_t k = static_cast<std::size_t>(rank_); k < total_size_; k += static_cast<std::size_t>(num_replicas_)) {
    out.push_back(at(k));
  }
  return out;
}

}  // namespace muster
