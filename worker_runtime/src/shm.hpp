// The ranks of one node and their shared segment: per-rank arrival and done
// counters (one cache line each) and two banks of one slot per rank. A
// collective moves through the segment chunk by chunk; each chunk is a step of
// a counter every local rank keeps in lockstep, and the bank alternates with
// the step, so a rank writing step s+2's data knows every peer has finished
// reading step s (it has seen them all arrive at step s+1).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "muster/net/unique_fd.hpp"
#include "muster/process_group.hpp"
#include "wait.hpp"

namespace muster::detail {

class ShmNode {
 public:
  // Segment size: header, 2 * local_size counter lines, 2 banks of slots.
  static std::size_t segment_bytes(int local_size, std::size_t slot_bytes);
  // Creates (create = true, the node's first rank) or opens the segment name.
  // pids: every local rank's process, watched while waiting.
  ShmNode(const std::string& name, bool create, int local_rank, int local_size, std::size_t slot_bytes,
          const std::vector<pid_t>& pids, std::vector<int> global_ranks);
  ~ShmNode();
  ShmNode(const ShmNode&) = delete;
  ShmNode& operator=(const ShmNode&) = delete;

  static void unlink(const std::string& name);

  // What becomes of this rank's share of a chunk once the node has reduced
  // it, in place (count elements): the hierarchical all-reduce reduces it
  // across nodes here (hierarchical.hpp). Empty: the node is the whole group,
  // and the share is final once averaged.
  using ShareStep = std::function<void(char* share, std::size_t count)>;
  // The collectives among this node's ranks.
  void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, int divisor, Clock::time_point deadline,
                  const ShareStep& across = {});
  void broadcast(void* data, std::size_t bytes, int root, Clock::time_point deadline);
  void all_gather(const void* in, void* out, std::size_t bytes, Clock::time_point deadline);
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                      Clock::time_point deadline);
  void barrier(Clock::time_point deadline);

  // Tells the node's ranks that this one failed (they stop waiting at once).
  void abort(int global_rank);
  std::size_t slot_bytes() const { return slot_bytes_; }

 private:
  uint64_t* line(std::size_t index) const;
  uint64_t* arrived(int local) const { return line(2 + local); }
  uint64_t* done(int local) const { return line(2 + local_size_ + local); }
  char* slot(uint64_t step, int local) const;
  void arrive(uint64_t step);
  void wait_arrived(uint64_t step, Clock::time_point deadline, const char* what);
  void mark_done(uint64_t step);
  void wait_done(uint64_t step, Clock::time_point deadline, const char* what);
  void check_peers();
  // Until every local rank's counter (arrived or done) reaches step.
  void wait_all(uint64_t* (ShmNode::*counter)(int) const, uint64_t step, Clock::time_point deadline, const char* what);

  int local_rank_;
  int local_size_;
  std::size_t slot_bytes_;
  std::size_t bytes_;
  char* base_ = nullptr;
  uint64_t step_ = 0;
  int spins_ = 2048;
  std::vector<net::UniqueFd> pidfds_;
  std::vector<pid_t> pids_;
  std::vector<int> global_ranks_;
};

}  // namespace muster::detail
