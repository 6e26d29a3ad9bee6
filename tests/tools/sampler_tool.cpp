// Test helper: writes muster::DistributedSampler's indices as little-endian
// int64 to a file, for comparison with torch's DistributedSampler.
//   sampler_tool OUT N REPLICAS RANK SEED EPOCH SHUFFLE(0/1) DROP_LAST(0/1)
//   sampler_tool OUT --randperm N SEED
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "muster/sampler.hpp"

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[2]) == "--randperm") {
    auto perm = muster::randperm(std::atoll(argv[3]), std::strtoull(argv[4], nullptr, 10));
    FILE* f = std::fopen(argv[1], "wb");
    if (!f) return 1;
    if (!perm.empty()) std::fwrite(perm.data(), sizeof(int64_t), perm.size(), f);
    return std::fclose(f) == 0 ? 0 : 1;
  }
  if (argc != 9) {
    std::fprintf(stderr, "usage: sampler_tool OUT N REPLICAS RANK SEED EPOCH SHUFFLE DROP_LAST\n");
    return 2;
  }
  muster::SamplerOptions opts;
  opts.seed = std::atoll(argv[5]);
  opts.shuffle = std::atoi(argv[7]) != 0;
  opts.drop_last = std::atoi(argv[8]) != 0;
  muster::DistributedSampler sampler(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]), std::atoi(argv[4]), opts);
  sampler.set_epoch(std::atoll(argv[6]));
  std::vector<int64_t> out;
  for (std::size_t i : sampler.iterate()) out.push_back(static_cast<int64_t>(i));
  if (out.size() != sampler.size()) return 3;
  FILE* f = std::fopen(argv[1], "wb");
  if (!f) return 1;
  if (!out.empty()) std::fwrite(out.data(), sizeof(int64_t), out.size(), f);
  return std::fclose(f) == 0 ? 0 : 1;
}
