// muster::DistributedSampler: the indices torch.utils.data.DistributedSampler
// yields, bit for bit, for the same dataset size, replicas, rank, seed, epoch,
// shuffle and drop_last; and muster::randperm, torch.randperm's CPU algorithm
// with a generator seeded by manual_seed(seed).
#pragma once

#include "muster/error.hpp"
#include "muster/export.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace muster {

class ProcessGroup;

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU.
// The generator keeps the low 32 bits of the seed, as torch's does.
MUSTER_API std::vector<int64_t> randperm(int64_t n, uint64_t seed);

struct SamplerOptions {
  bool shuffle = true;
  int64_t seed = 0;
  bool drop_last = false;
};

class MUSTER_API DistributedSampler {
 public:
  // Throws muster::Error for num_replicas < 1 or rank outside [0, num_replicas).
  DistributedSampler(std::size_t dataset_size, int num_replicas, int rank, SamplerOptions options = {});
  // num_replicas = group.size(), rank = group.rank(), as torch's sampler
  // takes them from the default group.
  DistributedSampler(std::size_t dataset_size, const ProcessGroup& group, SamplerOptions options = {});

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch (size() of them).
  std::vector<std::size_t> indices() const;
  // torch's len(sampler): num_samples.
  std::size_t size() const { return num_samples_; }
  std::size_t total_size() const { return total_size_; }

  // Iterates indices() of the epoch current when begin() is called.
  class Iterable {
   public:
    explicit Iterable(std::vector<std::size_t> v) : v_(std::move(v)) {}
    auto begin() const { return v_.begin(); }
    auto end() const { return v_.end(); }

   private:
    std::vector<std::size_t> v_;
  };
  Iterable iterate() const { return Iterable(indices()); }

 private:
  std::size_t dataset_size_;
  int num_replicas_;
  int rank_;
  SamplerOptions options_;
  int64_t epoch_ = 0;
  std::size_t num_samples_ = 0;
  std::size_t total_size_ = 0;
};

}  // namespace muster
