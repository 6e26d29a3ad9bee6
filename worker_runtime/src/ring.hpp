// The ring algorithms, written against a Link (link.hpp): all-reduce as a
// reduce-scatter then an all-gather round the ring, with a received piece
// reduced while the rest is still arriving; all-gather, reduce-scatter,
// broadcast and barrier on the same schedule. The ring owns its link.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "link.hpp"
#include "muster/process_group.hpp"
#include "wait.hpp"

namespace muster::detail {

class Ring {
 public:
  explicit Ring(std::unique_ptr<Link> link);
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  int size() const { return static_cast<int>(link_->members().size()); }
  int position() const { return link_->position(); }

  void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, int divisor, Clock::time_point deadline);
  // out holds size() blocks of bytes; this rank's block must already be in place.
  void all_gather_in_place(void* out, std::size_t bytes, Clock::time_point deadline);
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, int divisor,
                      Clock::time_point deadline);
  // root: a ring position.
  void broadcast(void* data, std::size_t bytes, int root, Clock::time_point deadline);
  void barrier(Clock::time_point deadline);
  // Makes the peers' pending operations fail at once.
  void shut() { link_->shut(); }

 private:
  // One reduce step: sends send_count elements, and reduces the recv_count
  // elements arriving from prev into target.
  void send_and_reduce(const char* send, std::size_t send_count, char* target, std::size_t recv_count, DataType type,
                       ReduceOp op, Clock::time_point deadline, const char* what);
  std::pair<std::size_t, std::size_t> segment(std::size_t count, int k) const;
  int mod(int v) const { return ((v % size()) + size()) % size(); }

  std::unique_ptr<Link> link_;
  std::vector<char> scratch_;
};

}  // namespace muster::detail
