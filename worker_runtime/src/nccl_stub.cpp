// libmuster built without CUDA/NCCL: the NCCL backend says so.
#include "muster/nccl.hpp"

namespace muster {

struct MUSTER_HIDDEN NcclCommunicator::Impl {};

bool nccl_built() { return false; }

namespace {
[[noreturn]] void missing() {
  throw Error("muster: this libmuster was built without the NCCL backend (CUDA or NCCL was not found at build "
              "time; rebuild with -DMUSTER_WITH_CUDA=ON and NCCL installed, or use the cpu backend)");
}
}  // namespace

NcclCommunicator::NcclCommunicator(ProcessGroup&, int) { missing(); }
NcclCommunicator::~NcclCommunicator() = default;
int NcclCommunicator::device() const { missing(); }
void NcclCommunicator::all_reduce(void*, std::size_t, DataType, ReduceOp, CUstream_st*) { missing(); }
void NcclCommunicator::broadcast(void*, std::size_t, DataType, int, CUstream_st*) { missing(); }
void NcclCommunicator::all_gather(const void*, void*, std::size_t, DataType, CUstream_st*) { missing(); }
void NcclCommunicator::reduce_scatter(const void*, void*, std::size_t, DataType, ReduceOp, CUstream_st*) { missing(); }
void NcclCommunicator::synchronize(CUstream_st*) { missing(); }
void NcclCommunicator::abort() {}

}  // namespace muster
