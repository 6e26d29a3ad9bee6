// muster's NCCL backend: collectives on GPU buffers for the ranks of a
// ProcessGroup, the NCCL unique id exchanged through the group's store.
// Present when libmuster was built with CUDA and NCCL (muster::nccl_built()).
//
//   auto pg = muster::init_process_group();
//   muster::NcclCommunicator nccl(pg);                 // device LOCAL_RANK
//   nccl.all_reduce(dev_grad, n, muster::DataType::float32, muster::ReduceOp::avg, stream);
//   nccl.synchronize(stream);                          // bounded by pg.timeout()
//
// The communicator is non-blocking: set-up and synchronize() poll, and past
// the group's timeout they abort it (ncclCommAbort) and throw
// muster::TimeoutError, so a dead peer never hangs the rank.
#pragma once

#include <cstddef>
#include <memory>

#include "muster/export.hpp"
#include "muster/process_group.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace muster {

// Whether this libmuster has the NCCL backend.
MUSTER_API bool nccl_built();

class MUSTER_API NcclCommunicator {
 public:
  // device: the CUDA device this rank uses (-1: its local rank). Throws
  // muster::Error when libmuster lacks NCCL or the device does not exist.
  explicit NcclCommunicator(ProcessGroup& group, int device = -1);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int device() const;
  // Enqueued on stream (nullptr: the default stream); data are device pointers.
  void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, CUstream_st* stream);
  void broadcast(void* data, std::size_t count, DataType type, int root, CUstream_st* stream);
  void all_gather(const void* in, void* out, std::size_t count, DataType type, CUstream_st* stream);
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, CUstream_st* stream);
  // Waits for the stream's work; past the timeout aborts the communicator.
  void synchronize(CUstream_st* stream);
  // Aborts the communicator: pending and later operations fail.
  void abort();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace muster
