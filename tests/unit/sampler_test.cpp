#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <set>

#include "muster/sampler.hpp"

using muster::DistributedSampler;
using muster::SamplerOptions;

TEST_CASE("randperm is a permutation and depends only on the low 32 bits of the seed", "[sampler]") {
  auto p = muster::randperm(1000, 42);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota);
  CHECK(muster::randperm(1000, 42 + (1ULL << 32)) == p);
  CHECK(muster::randperm(1000, 43) != p);
  CHECK(muster::randperm(1, 5) == std::vector<int64_t>{0});
  CHECK(muster::randperm(0, 5).empty());
}

TEST_CASE("without shuffle the ranks interleave and padding repeats from the front", "[sampler]") {
  SamplerOptions o;
  o.shuffle = false;
  DistributedSampler r0(10, 4, 0, o);
  DistributedSampler r3(10, 4, 3, o);
  CHECK(r0.size() == 3);
  CHECK(r0.indices() == std::vector<std::size_t>{0, 4, 8});
  CHECK(r3.indices() == std::vector<std::size_t>{3, 7, 1});
}

TEST_CASE("drop_last cuts to a multiple of the replicas", "[sampler]") {
  SamplerOptions o;
  o.shuffle = false;
  o.drop_last = true;
  DistributedSampler s(10, 4, 1, o);
  CHECK(s.size() == 2);
  CHECK(s.indices() == std::vector<std::size_t>{1, 5});
  CHECK(DistributedSampler(3, 5, 0, o).size() == 0);
}

TEST_CASE("every rank together covers the dataset once per epoch, differently per epoch", "[sampler]") {
  std::multiset<std::size_t> all;
  std::vector<std::size_t> first_epoch;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(99, 3, r);
    auto idx = s.indices();
    all.insert(idx.begin(), idx.end());
    if (r == 0) first_epoch = idx;
  }
  CHECK(all.size() == 99);
  CHECK(std::set<std::size_t>(all.begin(), all.end()).size() == 99);
  DistributedSampler s(99, 3, 0);
  s.set_epoch(1);
  CHECK(s.indices() != first_epoch);
}

TEST_CASE("bad replicas or rank are refused", "[sampler]") {
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0), muster::Error);
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2), muster::Error);
  CHECK_THROWS_AS(DistributedSampler(10, 2, -1), muster::Error);
}
