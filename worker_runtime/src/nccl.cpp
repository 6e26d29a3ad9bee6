// The NCCL backend (built when CUDA and NCCL are found).
#include "muster/nccl.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

namespace muster {

using Clock = std::chrono::steady_clock;

bool nccl_built() { return true; }

struct MUSTER_HIDDEN NcclCommunicator::Impl {
  ProcessGroup group;
  int device = 0;
  ncclComm_t comm = nullptr;
  bool aborted = false;

  std::string where() const { return "muster: rank " + std::to_string(group.rank()) + ": NCCL: "; }

  void abort_comm() {
    if (comm != nullptr && !aborted) {
      ncclCommAbort(comm);
      aborted = true;
      comm = nullptr;
    }
  }

  // Waits while NCCL reports ncclInProgress; past the deadline aborts.
  void settle(const char* what, Clock::time_point deadline) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
      if (rc != ncclSuccess) state = rc;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        std::string why = ncclGetErrorString(state);
        std::string last = ncclGetLastError(comm);
        abort_comm();
        throw Error(where() + what + " failed: " + why + (last.empty() ? "" : " (" + last + ")"));
      }
      if (Clock::now() >= deadline) {
        abort_comm();
        throw TimeoutError(where() + what + " did not finish within " + std::to_string(group.timeout().count()) +
                           " ms; the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void check_usable(const char* what) const {
    if (aborted || comm == nullptr) throw Error(where() + what + ": the communicator was aborted after a failure");
  }

  void enqueued(ncclResult_t rc, const char* what) {
    if (rc == ncclSuccess) return;
    if (rc == ncclInProgress) {
      settle(what, Clock::now() + group.timeout());
      return;
    }
    std::string last = ncclGetLastError(comm);
    abort_comm();
    throw Error(where() + what + " failed: " + ncclGetErrorString(rc) + (last.empty() ? "" : " (" + last + ")"));
  }
};

namespace {

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::float32: return ncclFloat32;
    case DataType::float64: return ncclFloat64;
    case DataType::int32: return ncclInt32;
    case DataType::int64: return ncclInt64;
    case DataType::bfloat16: return ncclBfloat16;
    case DataType::float16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::prod: return ncclProd;
  }
  return ncclSum;
}

}  // namespace

NcclCommunicator::NcclCommunicator(ProcessGroup& group, int device) : impl_(std::make_unique<Impl>()) {
  auto& g = *impl_;
  g.group = group;
  g.device = device >= 0 ? device : group.local_rank();
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || count == 0) {
    throw Error(g.where() + "no CUDA device is visible (" + (ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices") +
                "); use the cpu backend or run on a GPU node");
  }
  if (g.device >= count) {
    throw Error(g.where() + "device " + std::to_string(g.device) + " does not exist (" + std::to_string(count) +
                " visible); one rank per GPU: --nproc-per-node at most the GPU count");
  }
  if ((ce = cudaSetDevice(g.device)) != cudaSuccess) {
    throw Error(g.where() + "cudaSetDevice(" + std::to_string(g.device) + "): " + cudaGetErrorString(ce));
  }
  // The unique id, from rank 0, through the group's store.
  const std::string key = group.next_key("nccl");
  ncclUniqueId id;
  if (group.rank() == 0) {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) throw Error(g.where() + "ncclGetUniqueId: " + ncclGetErrorString(rc));
    group.store_set(key, std::string(id.internal, sizeof id.internal));
  } else {
    std::string v = group.store_get(key);
    if (v.size() != sizeof id.internal) throw Error(g.where() + "the unique id in the store has the wrong size");
    std::memcpy(id.internal, v.data(), sizeof id.internal);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // abortable
  ncclResult_t rc = ncclCommInitRankConfig(&g.comm, group.size(), id, group.rank(), &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    throw Error(g.where() + "ncclCommInitRankConfig: " + ncclGetErrorString(rc));
  }
  g.settle("communicator set-up", Clock::now() + group.timeout());
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_ || impl_->comm == nullptr) return;
  auto& g = *impl_;
  // Finalize (bounded: settle aborts past the timeout), then destroy.
  ncclResult_t rc = ncclCommFinalize(g.comm);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    g.abort_comm();
    return;
  }
  try {
    g.settle("finalize", Clock::now() + g.group.timeout());
  } catch (const Error&) {
    return;  // aborted
  }
  ncclCommDestroy(g.comm);
}

int NcclCommunicator::device() const { return impl_->device; }

void NcclCommunicator::all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, CUstream_st* stream) {
  impl_->check_usable("all_reduce");
  impl_->enqueued(ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), impl_->comm, stream), "all_reduce");
}

void NcclCommunicator::broadcast(void* data, std::size_t count, DataType type, int root, CUstream_st* stream) {
  impl_->check_usable("broadcast");
  impl_->enqueued(ncclBroadcast(data, data, count, nccl_type(type), root, impl_->comm, stream), "broadcast");
}

void NcclCommunicator::all_gather(const void* in, void* out, std::size_t count, DataType type, CUstream_st* stream) {
  impl_->check_usable("all_gather");
  impl_->enqueued(ncclAllGather(in, out, count, nccl_type(type), impl_->comm, stream), "all_gather");
}

void NcclCommunicator::reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                                      CUstream_st* stream) {
  impl_->check_usable("reduce_scatter");
  impl_->enqueued(ncclReduceScatter(in, out, count, nccl_type(type), nccl_op(op), impl_->comm, stream),
                  "reduce_scatter");
}

void NcclCommunicator::synchronize(CUstream_st* stream) {
  auto& g = *impl_;
  g.check_usable("synchronize");
  auto deadline = Clock::now() + g.group.timeout();
  while (true) {
    cudaError_t ce = cudaStreamQuery(stream);
    if (ce == cudaSuccess) return;
    if (ce != cudaErrorNotReady) {
      g.abort_comm();
      throw Error(g.where() + "the stream failed: " + cudaGetErrorString(ce));
    }
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(g.comm, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      g.abort_comm();
      throw Error(g.where() + "a collective failed: " + ncclGetErrorString(state) + "; the communicator was aborted");
    }
    if (Clock::now() >= deadline) {
      g.abort_comm();
      throw TimeoutError(g.where() + "the stream's collectives did not finish within " +
                         std::to_string(g.group.timeout().count()) + " ms (a peer died or hangs); the communicator was aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicator::abort() {
  if (impl_) impl_->abort_comm();
}

}  // namespace muster
