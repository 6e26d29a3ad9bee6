// A worker for the process-group tests, started by muster or torchrun (one
// per rank). Modes:
//   check             every collective, dtype and op over a range of sizes
//                     (below, at and above the shared-memory slot and the ring
//                     segment), results compared with a locally computed
//                     expectation; prints "collectives ok rank=R transport=T"
//   die RANK          that rank exits in the middle of an all_reduce loop; the
//                     others must fail with muster::Error (exit 3 if they do)
//   stall RANK MS     that rank sleeps MS ms before its first all_reduce; the
//                     others' group has MUSTER_TEST_TIMEOUT_MS and must time out
//                     (exit 4 on TimeoutError)
//   info              prints rank, size, local rank/size, nodes, transport
//   named             two named groups formed at once on two threads, started
//                     in opposite orders on odd and even ranks; each all_reduces
//                     and hands out its own keys; a bad name is refused;
//                     prints "named groups ok rank=R"
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "muster/process_group.hpp"

using muster::DataType;
using muster::ReduceOp;

namespace {

int g_failures = 0;

void fail(const std::string& what) {
  if (++g_failures <= 20) std::fprintf(stderr, "rank %s: MISMATCH %s\n", std::getenv("RANK"), what.c_str());
}

// The value rank r contributes at index i for op: small integers, so every
// dtype (float16 too) holds every sum and product exactly.
double input(ReduceOp op, int r, std::size_t i) {
  switch (op) {
    case ReduceOp::prod: return static_cast<double>((i + r) % 2 + 1);
    case ReduceOp::min:
    case ReduceOp::max: return static_cast<double>((r * 5 + i * 3) % 11) - 5;
    default: return static_cast<double>((r + 1) * (i % 7 + 1));
  }
}

double expected(ReduceOp op, int world, std::size_t i) {
  double acc = input(op, 0, i);
  for (int r = 1; r < world; ++r) {
    double v = input(op, r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += v; break;
      case ReduceOp::prod: acc *= v; break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::max: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::avg) acc /= world;
  return acc;
}

template <typename T>
T from_double(double d) {
  if constexpr (std::is_same_v<T, muster::Half> || std::is_same_v<T, muster::BFloat16>) {
    return T(static_cast<float>(d));
  } else {
    return static_cast<T>(d);
  }
}
template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, muster::Half> || std::is_same_v<T, muster::BFloat16>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

template <typename T>
double tolerance(double value) {
  if constexpr (std::is_same_v<T, muster::Half>) return std::abs(value) / 1024 + 1e-3;
  if constexpr (std::is_same_v<T, muster::BFloat16>) return std::abs(value) / 128 + 1e-2;
  if constexpr (std::is_floating_point_v<T>) return std::abs(value) * 1e-6 + 1e-9;
  return 0;  // integers: exact (avg truncates)
}

template <typename T>
void check_type(muster::ProcessGroup& pg, const std::vector<std::size_t>& sizes) {
  const int rank = pg.rank(), world = pg.size();
  const DataType type = muster::data_type_of<T>();
  const char* tn = muster::data_type_name(type);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::prod}) {
    for (std::size_t n : sizes) {
      std::vector<T> data(n);
      for (std::size_t i = 0; i < n; ++i) data[i] = from_double<T>(input(op, rank, i));
      pg.all_reduce(std::span<T>(data), op);
      for (std::size_t i = 0; i < n; ++i) {
        double want = expected(op, world, i);
        if constexpr (std::is_integral_v<T>) want = std::trunc(want);
        double got = to_double(data[i]);
        if (std::abs(got - want) > tolerance<T>(want)) {
          fail(std::string("all_reduce ") + tn + " " + muster::reduce_op_name(op) + " n=" + std::to_string(n) +
               " i=" + std::to_string(i) + " got " + std::to_string(got) + " want " + std::to_string(want));
          break;
        }
      }
    }
  }
  for (std::size_t n : sizes) {
    // broadcast from every root
    for (int root = 0; root < world; ++root) {
      std::vector<T> data(n);
      for (std::size_t i = 0; i < n; ++i) data[i] = from_double<T>(rank == root ? double((i * 13 + root) % 100) : -1.0);
      pg.broadcast(std::span<T>(data), root);
      for (std::size_t i = 0; i < n; ++i) {
        if (to_double(data[i]) != double((i * 13 + root) % 100)) {
          fail(std::string("broadcast ") + tn + " root=" + std::to_string(root) + " n=" + std::to_string(n) +
               " i=" + std::to_string(i));
          break;
        }
      }
    }
    // all_gather
    std::vector<T> mine(n), all(n * world);
    for (std::size_t i = 0; i < n; ++i) mine[i] = from_double<T>(double((rank * 31 + i) % 97));
    pg.all_gather(std::span<const T>(mine), std::span<T>(all));
    for (int r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        if (to_double(all[r * n + i]) != double((r * 31 + i) % 97)) {
          fail(std::string("all_gather ") + tn + " n=" + std::to_string(n) + " block " + std::to_string(r));
          r = world;
          break;
        }
      }
    }
    // reduce_scatter (sum and max)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      std::vector<T> in(n * world), out(n);
      for (int b = 0; b < world; ++b)
        for (std::size_t i = 0; i < n; ++i) in[b * n + i] = from_double<T>(input(op, rank, b * n + i));
      pg.reduce_scatter(std::span<const T>(in), std::span<T>(out), op);
      for (std::size_t i = 0; i < n; ++i) {
        double want = expected(op, world, rank * n + i);
        if (std::abs(to_double(out[i]) - want) > tolerance<T>(want)) {
          fail(std::string("reduce_scatter ") + tn + " " + muster::reduce_op_name(op) + " n=" + std::to_string(n) +
               " i=" + std::to_string(i));
          break;
        }
      }
    }
  }
}

int run_check(muster::ProcessGroup& pg) {
  // 0, tiny, odd, one slot's worth of float32 and more, and above the ring's
  // 4 MiB segment for the larger types.
  std::vector<std::size_t> small{0, 1, 3, 17, 1000, 4099};
  std::vector<std::size_t> large{131072, 300001};
  std::vector<std::size_t> all = small;
  all.insert(all.end(), large.begin(), large.end());
  check_type<float>(pg, all);
  check_type<double>(pg, all);
  check_type<int32_t>(pg, all);
  // One large size each: several chunks of the two-wait path and ring pieces.
  std::vector<std::size_t> with_large = small;
  with_large.push_back(300001);
  check_type<int64_t>(pg, with_large);
  check_type<muster::BFloat16>(pg, with_large);
  check_type<muster::Half>(pg, with_large);
  // A big float32 all_reduce: several ring pieces and many shm chunks.
  {
    std::size_t n = (9u << 20) / 4 + 5;
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((pg.rank() + 1) * (i % 7 + 1));
    pg.all_reduce(std::span<float>(v), ReduceOp::sum);
    double tri = pg.size() * (pg.size() + 1) / 2.0;
    for (std::size_t i = 0; i < n; ++i) {
      if (v[i] != static_cast<float>(tri * (i % 7 + 1))) {
        fail("big all_reduce i=" + std::to_string(i));
        break;
      }
    }
  }
  for (int i = 0; i < 50; ++i) pg.barrier();
  if (g_failures != 0) {
    std::fprintf(stderr, "rank %d: %d mismatches\n", pg.rank(), g_failures);
    return 1;
  }
  std::printf("collectives ok rank=%d size=%d transport=%s\n", pg.rank(), pg.size(), pg.transport().c_str());
  return 0;
}

int run_named(muster::ProcessGroup& pg, const muster::ProcessGroupOptions& base) {
  muster::ProcessGroupOptions bad = base;
  bad.name = "a/b";
  try {
    muster::ProcessGroup::create(bad);
    fail("the group name a/b was accepted");
  } catch (const muster::Error& e) {
    if (std::strstr(e.what(), "group name") == nullptr) fail(std::string("unclear error for a/b: ") + e.what());
  }
  const char* names[2] = {"left", "right"};
  if (pg.rank() % 2 == 1) std::swap(names[0], names[1]);
  muster::ProcessGroup groups[2];
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      try {
        muster::ProcessGroupOptions o = base;
        o.name = names[t];
        // Even ranks make left first, odd ones right first. Each group sums
        // something of its own, so groups that paired up wrongly (as unnamed
        // groups made in different orders do) give a wrong sum.
        if (t == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        groups[t] = muster::ProcessGroup::create(o);
        const double scale = std::string(names[t]) == "left" ? 1.0 : 10.0;
        std::vector<double> v(1000, (pg.rank() + 1.0) * scale);
        groups[t].all_reduce(std::span<double>(v));
        double want = scale * pg.size() * (pg.size() + 1) / 2.0;
        if (v[0] != want || v[999] != want) fail(std::string("all_reduce in group ") + names[t]);
        if (groups[t].name() != names[t]) fail("the name of group " + std::string(names[t]));
        if (groups[t].next_key("nccl") != "nccl/0" || groups[t].next_key("nccl") != "nccl/1") {
          fail(std::string("the keys of group ") + names[t]);
        }
      } catch (const muster::Error& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 2; ++t) {
    if (!errors[t].empty()) fail(std::string("group ") + names[t] + ": " + errors[t]);
    if (groups[t].valid()) groups[t].destroy();
  }
  if (g_failures != 0) return 1;
  std::printf("named groups ok rank=%d\n", pg.rank());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "check";
  muster::ProcessGroupOptions opts;
  if (const char* t = std::getenv("MUSTER_TEST_TIMEOUT_MS")) opts.timeout = std::chrono::milliseconds(std::atoll(t));
  try {
    auto pg = muster::init_process_group(opts);
    if (mode == "info") {
      std::printf("rank=%d size=%d local_rank=%d local_size=%d nodes=%d transport=%s\n", pg.rank(), pg.size(),
                  pg.local_rank(), pg.local_size(), pg.node_count(), pg.transport().c_str());
      pg.barrier();
      muster::destroy_process_group();
      return 0;
    }
    if (mode == "check") {
      int rc = run_check(pg);
      muster::destroy_process_group();
      return rc;
    }
    if (mode == "named") {
      int rc = run_named(pg, opts);
      muster::destroy_process_group();
      return rc;
    }
    if (mode == "die" && argc > 2) {
      int victim = std::atoi(argv[2]);
      std::vector<float> v(1 << 16, 1.0f);
      auto start = std::chrono::steady_clock::now();
      try {
        for (int i = 0; i < 1000000; ++i) {
          if (pg.rank() == victim && i == 200) _exit(9);
          pg.all_reduce(std::span<float>(v));
          std::fill(v.begin(), v.end(), 1.0f);
        }
      } catch (const muster::Error& e) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
        std::printf("rank %d failed as expected after %lld ms: %s\n", pg.rank(), static_cast<long long>(ms), e.what());
        std::fflush(stdout);
        // A second call reports the group unusable.
        try {
          pg.barrier();
        } catch (const muster::Error& again) {
          std::printf("then: %s\n", again.what());
        }
        return 3;
      }
      return 0;
    }
    if (mode == "stall" && argc > 3) {
      int victim = std::atoi(argv[2]);
      if (pg.rank() == victim) std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[3])));
      std::vector<double> v(100, 1.0);
      try {
        pg.all_reduce(std::span<double>(v));
      } catch (const muster::TimeoutError& e) {
        std::printf("rank %d timed out: %s\n", pg.rank(), e.what());
        return 4;
      } catch (const muster::Error& e) {
        std::printf("rank %d failed: %s\n", pg.rank(), e.what());
        return 3;
      }
      return 0;
    }
    std::fprintf(stderr, "usage: collectives_tool check|info|named|die RANK|stall RANK MS\n");
    return 2;
  } catch (const muster::Error& e) {
    std::fprintf(stderr, "rank %s: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?", e.what());
    return 1;
  }
}
