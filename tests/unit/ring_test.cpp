// The ring algorithms (worker_runtime/src/ring.hpp) over a link of the
// test's own: memory queues between threads, which hand over received bytes
// in uneven pieces, so the reduce-as-it-arrives path runs on partial data.
#include <catch2/catch.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "../../worker_runtime/src/link.hpp"
#include "../../worker_runtime/src/ring.hpp"

using namespace muster;
using namespace muster::detail;

namespace {

struct Queue {
  std::mutex m;
  std::condition_variable cv;
  std::deque<char> bytes;
  bool shut = false;
};

class MemoryLink final : public Link {
 public:
  MemoryLink(std::vector<int> members, int position, Queue& to_next, Queue& from_prev)
      : members_(std::move(members)), position_(position), out_(to_next), in_(from_prev) {}

  const std::vector<int>& members() const override { return members_; }
  int position() const override { return position_; }
  void exchange(const char* send, std::size_t send_len, char* recv, std::size_t recv_len,
                const std::function<void(std::size_t)>& on_recv, Clock::time_point deadline,
                const char* what) override {
    {
      std::lock_guard lock(out_.m);
      if (out_.shut) throw Error(std::string("the link was shut during ") + what);
      out_.bytes.insert(out_.bytes.end(), send, send + send_len);
    }
    out_.cv.notify_all();
    std::size_t got = 0;
    std::size_t piece = 1000;  // uneven pieces: 1000, 1001, ... bytes
    while (got < recv_len) {
      std::unique_lock lock(in_.m);
      if (!in_.cv.wait_until(lock, deadline, [&] { return in_.shut || !in_.bytes.empty(); })) {
        throw TimeoutError(std::string("no bytes from prev during ") + what);
      }
      if (in_.shut) throw Error(std::string("the link was shut during ") + what);
      std::size_t n = std::min({piece++, recv_len - got, in_.bytes.size()});
      std::copy_n(in_.bytes.begin(), n, recv + got);
      in_.bytes.erase(in_.bytes.begin(), in_.bytes.begin() + static_cast<std::ptrdiff_t>(n));
      got += n;
      lock.unlock();
      if (on_recv) on_recv(got);
    }
  }
  void shut() override {
    for (Queue* q : {&out_, &in_}) {
      {
        std::lock_guard lock(q->m);
        q->shut = true;
      }
      q->cv.notify_all();
    }
  }

 private:
  std::vector<int> members_;
  int position_;
  Queue& out_;
  Queue& in_;
};

// n rings over memory: queue i carries position i's bytes to position i+1.
struct Rings {
  explicit Rings(int n) : queues(static_cast<std::size_t>(n)) {
    std::vector<int> members(static_cast<std::size_t>(n));
    std::iota(members.begin(), members.end(), 0);
    for (int p = 0; p < n; ++p) {
      Queue& out = queues[static_cast<std::size_t>(p)];
      Queue& in = queues[static_cast<std::size_t>((p + n - 1) % n)];
      rings.push_back(std::make_unique<Ring>(std::make_unique<MemoryLink>(members, p, out, in)));
    }
  }
  // Runs f(position, ring) on a thread per position; rethrows nothing, counts errors.
  template <typename F>
  int run(F&& f) {
    std::vector<std::thread> threads;
    std::vector<int> failed(rings.size(), 0);
    for (std::size_t p = 0; p < rings.size(); ++p) {
      threads.emplace_back([&, p] {
        try {
          f(static_cast<int>(p), *rings[p]);
        } catch (const Error&) {
          failed[p] = 1;
        }
      });
    }
    for (auto& t : threads) t.join();
    return std::accumulate(failed.begin(), failed.end(), 0);
  }
  std::deque<Queue> queues;
  std::vector<std::unique_ptr<Ring>> rings;
};

Clock::time_point soon() { return Clock::now() + std::chrono::seconds(30); }

}  // namespace

TEST_CASE("the ring all-reduces, averages and keeps every rank's result equal", "[ring]") {
  for (int n : {2, 3, 5}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{4}, std::size_t{1000}, std::size_t{70001}}) {
      Rings rings(n);
      std::vector<std::vector<int64_t>> data(static_cast<std::size_t>(n));
      for (int p = 0; p < n; ++p) {
        for (std::size_t i = 0; i < count; ++i) data[static_cast<std::size_t>(p)].push_back(static_cast<int64_t>(i) * (p + 1));
      }
      CHECK(rings.run([&](int p, Ring& r) {
        r.all_reduce(data[static_cast<std::size_t>(p)].data(), count, DataType::int64, ReduceOp::sum, 1, soon());
      }) == 0);
      const int64_t factor = static_cast<int64_t>(n) * (n + 1) / 2;
      for (int p = 0; p < n; ++p) {
        bool right = true;
        for (std::size_t i = 0; i < count; ++i) right = right && data[static_cast<std::size_t>(p)][i] == static_cast<int64_t>(i) * factor;
        CHECK(right);
      }
      std::vector<std::vector<double>> avg(static_cast<std::size_t>(n), std::vector<double>(count));
      for (int p = 0; p < n; ++p) std::fill(avg[static_cast<std::size_t>(p)].begin(), avg[static_cast<std::size_t>(p)].end(), p);
      CHECK(rings.run([&](int p, Ring& r) {
        r.all_reduce(avg[static_cast<std::size_t>(p)].data(), count, DataType::float64, ReduceOp::avg, n, soon());
      }) == 0);
      for (int p = 0; p < n; ++p) CHECK(avg[static_cast<std::size_t>(p)] == std::vector<double>(count, (n - 1) / 2.0));
    }
  }
}

TEST_CASE("the ring all-gathers, reduce-scatters, broadcasts and meets at a barrier", "[ring]") {
  const int n = 4;
  Rings rings(n);
  const std::size_t count = 777;
  // all_gather: block p holds p's values.
  std::vector<std::vector<int32_t>> gathered(n, std::vector<int32_t>(count * n, -1));
  for (int p = 0; p < n; ++p) {
    std::fill_n(gathered[p].begin() + static_cast<std::ptrdiff_t>(p * count), count, p * 10);
  }
  CHECK(rings.run([&](int p, Ring& r) { r.all_gather_in_place(gathered[p].data(), count * sizeof(int32_t), soon()); }) == 0);
  for (int p = 0; p < n; ++p) {
    for (int b = 0; b < n; ++b) CHECK(gathered[p][static_cast<std::size_t>(b) * count + 5] == b * 10);
  }
  // reduce_scatter: rank p ends with the max of block p over all ranks.
  std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count * n));
  for (int p = 0; p < n; ++p) {
    for (std::size_t i = 0; i < in[p].size(); ++i) in[p][i] = static_cast<int32_t>(i) + p;
  }
  std::vector<std::vector<int32_t>> out(n, std::vector<int32_t>(count));
  CHECK(rings.run([&](int p, Ring& r) {
    r.reduce_scatter(in[p].data(), out[p].data(), count, DataType::int32, ReduceOp::max, 1, soon());
  }) == 0);
  for (int p = 0; p < n; ++p) {
    CHECK(out[p][0] == static_cast<int32_t>(p * count) + n - 1);
    CHECK(out[p][count - 1] == static_cast<int32_t>(p * count + count - 1) + n - 1);
  }
  // broadcast from position 2.
  std::vector<std::vector<char>> bytes(n, std::vector<char>(100000, 0));
  std::fill(bytes[2].begin(), bytes[2].end(), 'b');
  CHECK(rings.run([&](int p, Ring& r) { r.broadcast(bytes[p].data(), bytes[p].size(), 2, soon()); }) == 0);
  for (int p = 0; p < n; ++p) CHECK(std::all_of(bytes[p].begin(), bytes[p].end(), [](char c) { return c == 'b'; }));
  CHECK(rings.run([&](int, Ring& r) { r.barrier(soon()); }) == 0);
}

TEST_CASE("a ring whose link is shut fails its pending collective instead of waiting", "[ring]") {
  Rings rings(3);
  std::vector<float> data(1000, 1.0f);
  // Position 0 never joins; it shuts its link, as a failing rank's group does.
  int failed = rings.run([&](int p, Ring& r) {
    if (p == 0) {
      r.shut();
      return;
    }
    std::vector<float> mine = data;
    r.all_reduce(mine.data(), mine.size(), DataType::float32, ReduceOp::sum, 1, soon());
  });
  CHECK(failed == 2);
}
