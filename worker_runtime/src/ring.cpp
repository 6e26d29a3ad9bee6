#include "ring.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

#include "reduce.hpp"

namespace muster::detail {
namespace {
// Large buffers go round the ring in pieces of at most this many bytes per
// segment, which bounds the scratch memory.
constexpr std::size_t kMaxSegmentBytes = 4 << 20;
// Reduce a received piece once this much of it has arrived.
constexpr std::size_t kReduceGrain = 64 << 10;
const std::function<void(std::size_t)> nothing;  // no work as bytes arrive
}  // namespace

Ring::Ring(std::unique_ptr<Link> link) : link_(std::move(link)) {}

void Ring::send_and_reduce(const char* send, std::size_t send_count, char* target, std::size_t recv_count,
                              DataType type, ReduceOp op, Clock::time_point deadline, const char* what) {
  const std::size_t es = element_size(type);
  if (scratch_.size() < recv_count * es) scratch_.resize(recv_count * es);
  std::size_t reduced = 0;
  // Reduce what has arrived in grains, while the rest is still on its way.
  auto on_recv = [&](std::size_t got_bytes) {
    std::size_t ready = got_bytes / es;
    if (ready - reduced >= kReduceGrain / es || ready == recv_count) {
      combine(type, op, target + reduced * es, target + reduced * es, scratch_.data() + reduced * es, ready - reduced);
      reduced = ready;
    }
  };
  link_->exchange(send, send_count * es, scratch_.data(), recv_count * es, on_recv, deadline, what);
}

std::pair<std::size_t, std::size_t> Ring::segment(std::size_t count, int k) const {
  std::size_t n = static_cast<std::size_t>(size());
  std::size_t base = count / n, rem = count % n;
  std::size_t kk = static_cast<std::size_t>(k);
  std::size_t start = kk * base + std::min(kk, rem);
  return {start, base + (kk < rem ? 1 : 0)};
}

void Ring::all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, int divisor,
                         Clock::time_point deadline) {
  const std::size_t es = element_size(type);
  const int n = size();
  if (n == 1) {
    finish(type, op, data, count, divisor);
    return;
  }
  const std::size_t piece_max = std::max<std::size_t>(1, kMaxSegmentBytes / es) * n;
  char* all = static_cast<char*>(data);
  for (std::size_t off = 0; off < count; off += piece_max) {
    const std::size_t len = std::min(piece_max, count - off);
    char* buf = all + off * es;
    // Reduce-scatter: after n-1 steps, segment position+1 is complete here.
    for (int s = 0; s < n - 1; ++s) {
      auto [so, sl] = segment(len, mod(position() - s));
      auto [ro, rl] = segment(len, mod(position() - s - 1));
      send_and_reduce(buf + so * es, sl, buf + ro * es, rl, type, op, deadline, "all_reduce");
    }
    auto [oo, ol] = segment(len, mod(position() + 1));
    finish(type, op, buf + oo * es, ol, divisor);
    // All-gather the complete segments.
    for (int s = 0; s < n - 1; ++s) {
      auto [so, sl] = segment(len, mod(position() + 1 - s));
      auto [ro, rl] = segment(len, mod(position() - s));
      link_->exchange(buf + so * es, sl * es, buf + ro * es, rl * es, nothing, deadline, "all_reduce");
    }
  }
}

void Ring::all_gather_in_place(void* out, std::size_t bytes, Clock::time_point deadline) {
  char* o = static_cast<char*>(out);
  const int n = size();
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(position() - s), rb = mod(position() - s - 1);
    link_->exchange(o + sb * bytes, bytes, o + rb * bytes, bytes, nothing, deadline, "all_gather");
  }
}

void Ring::reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, int divisor,
                             Clock::time_point deadline) {
  const std::size_t es = element_size(type);
  const int n = size();
  const std::size_t block = count * es;
  std::vector<char> work(static_cast<const char*>(in), static_cast<const char*>(in) + block * n);
  // The same schedule as all_reduce's first half, shifted by one so that this
  // rank ends with its own block.
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(position() - s - 1), rb = mod(position() - s - 2);
    send_and_reduce(work.data() + sb * block, count, work.data() + rb * block, count, type, op, deadline,
                    "reduce_scatter");
  }
  char* mine = work.data() + position() * block;
  finish(type, op, mine, count, divisor);
  std::memcpy(out, mine, block);
}

void Ring::broadcast(void* data, std::size_t bytes, int root, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  const bool last = mod(position() + 1) == root;
  for (std::size_t off = 0; off < bytes; off += kMaxSegmentBytes) {
    std::size_t len = std::min(kMaxSegmentBytes, bytes - off);
    if (position() != root) link_->exchange(nullptr, 0, p + off, len, nothing, deadline, "broadcast");
    if (!last) link_->exchange(p + off, len, nullptr, 0, nothing, deadline, "broadcast");
  }
}

void Ring::barrier(Clock::time_point deadline) {
  // Everyone's token has to come round: nobody leaves before all arrived.
  std::vector<int32_t> tokens(size(), 0);
  tokens[position()] = 1;
  all_gather_in_place(tokens.data(), sizeof(int32_t), deadline);
}

}  // namespace muster::detail
