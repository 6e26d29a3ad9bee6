// muster's process group: the ranks of one job, formed from the launcher's
// environment (env://, as torch.distributed.init_process_group reads it) or
// from explicit options, and the collectives on CPU buffers.
//
//   auto pg = muster::init_process_group();          // RANK, WORLD_SIZE, MASTER_*, ...
//   pg.all_reduce(std::span(grad), muster::ReduceOp::avg);
//   muster::destroy_process_group();
//
// Ranks of one node share memory (the data copied in once, reduced, copied
// out); nodes form TCP rings; all_reduce is hierarchical when there are both.
// Peers find each other through the job's TCPStore. Every collective is
// bounded by the group's timeout, and a peer that exits makes the collective
// fail at once: it throws muster::Error and the group is unusable after.
//
// A ProcessGroup is a handle: copies share one group. Its collectives are
// called by one thread at a time, in the same order on every rank.
#pragma once

#include "muster/error.hpp"
#include "muster/export.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace muster {

enum class DataType { float32, float64, int32, int64, bfloat16, float16 };
enum class ReduceOp { sum, avg, min, max, prod };

MUSTER_API std::size_t element_size(DataType type);
MUSTER_API const char* data_type_name(DataType type);
MUSTER_API const char* reduce_op_name(ReduceOp op);

// IEEE binary16 and bfloat16 as 16-bit storage types (what torch.float16 and
// torch.bfloat16 hold). Arithmetic goes through float; conversions round to
// nearest even.
struct MUSTER_API Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f);
  explicit operator float() const;
};
struct MUSTER_API BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f);
  explicit operator float() const;
};

template <typename T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, float>) return DataType::float32;
  else if constexpr (std::is_same_v<T, double>) return DataType::float64;
  else if constexpr (std::is_same_v<T, int32_t>) return DataType::int32;
  else if constexpr (std::is_same_v<T, int64_t>) return DataType::int64;
  else if constexpr (std::is_same_v<T, BFloat16>) return DataType::bfloat16;
  else if constexpr (std::is_same_v<T, Half>) return DataType::float16;
  else static_assert(sizeof(T) == 0, "muster collectives take float, double, int32_t, int64_t, BFloat16 or Half");
}

// What every failure of the process group throws: muster::Error and
// muster::TimeoutError (muster/error.hpp).

struct ProcessGroupOptions {
  // Unset fields come from the environment: RANK, WORLD_SIZE, LOCAL_RANK,
  // LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE,
  // TORCHELASTIC_RESTART_COUNT.
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  // true: a store already serves MASTER_ADDR:MASTER_PORT (the launcher's);
  // false: rank 0 starts one there, as torch's env:// does without an agent.
  std::optional<bool> use_agent_store;
  std::optional<int> restart_count;
  // Bounds the set-up and every collective (torch's default for CPU groups).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // "cpu" is the one backend of ProcessGroup; NCCL has its own class
  // (muster/nccl.hpp) built on a ProcessGroup's store.
  std::string backend = "cpu";
  // The group's name: its keys in the store go under it, so groups that ranks
  // make in different orders still find each other. Up to 128 letters,
  // digits, '_', '-' or '.'. Unnamed groups are named by how many unnamed
  // ones this process made before (pg0, pg1, ...): every rank must then make
  // them in the same order, as with torch's unnamed groups.
  std::string name;
};

class MUSTER_API ProcessGroup {
 public:
  // Forms the group: connects to (or starts) the store, exchanges addresses,
  // maps the node's shared memory and connects the TCP rings. Every rank calls
  // it; it returns once all have. Throws muster::Error / TimeoutError.
  static ProcessGroup create(const ProcessGroupOptions& options = {});

  ProcessGroup() = default;  // an empty handle; valid() is false
  bool valid() const { return impl_ != nullptr; }

  int rank() const;
  int size() const;
  // LOCAL_RANK / LOCAL_WORLD_SIZE (or the options); without them, this
  // rank's index among the ranks found on its node, and their number.
  int local_rank() const;
  int local_size() const;
  int node_count() const;
  int restart_count() const;
  std::chrono::milliseconds timeout() const;
  // What this rank uses: "shm", "tcp" or "shm+tcp" (hierarchical).
  std::string transport() const;

  // In place: data on every rank becomes op over all ranks' data.
  void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op = ReduceOp::sum);
  // data (count elements) from root to every rank.
  void broadcast(void* data, std::size_t count, DataType type, int root = 0);
  // out (size() * count elements) holds every rank's in (count), in rank order.
  void all_gather(const void* in, void* out, std::size_t count, DataType type);
  // in holds size() blocks of count elements; out (count) gets block rank()
  // reduced over all ranks.
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op = ReduceOp::sum);
  void barrier();

  template <typename T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::sum) {
    all_reduce(data.data(), data.size(), data_type_of<std::remove_const_t<T>>(), op);
  }
  template <typename T>
  void broadcast(std::span<T> data, int root = 0) {
    broadcast(data.data(), data.size(), data_type_of<T>(), root);
  }
  template <typename T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check_span_sizes("all_gather", in.size(), out.size());
    all_gather(in.data(), out.data(), in.size(), data_type_of<T>());
  }
  template <typename T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    check_span_sizes("reduce_scatter", out.size(), in.size());
    reduce_scatter(in.data(), out.data(), out.size(), data_type_of<T>(), op);
  }

  // The job's store, under this group's key prefix (what the NCCL backend
  // exchanges its unique id through). Blocking, bounded by timeout().
  void store_set(const std::string& key, const std::string& value);
  // The group's name (ProcessGroupOptions::name, or pg<n>).
  const std::string& name() const;
  // A fresh key of this group for `kind`: kind/0, kind/1, ... in the order
  // this rank asks. The NCCL backend takes its unique id's key from here, so
  // communicators of different groups never share one; ranks that make the
  // same calls on a group in the same order get the same keys.
  std::string next_key(const std::string& kind);
  std::string store_get(const std::string& key);

  // Closes the connections and unmaps the shared memory. Later calls throw.
  void destroy();

  struct Impl;

 private:
  explicit ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl& impl() const;
  void check_span_sizes(const char* what, std::size_t small, std::size_t big) const;
  std::shared_ptr<Impl> impl_;
};

// torch.distributed's module-level style: one default group per process.
MUSTER_API ProcessGroup init_process_group(const ProcessGroupOptions& options = {});
MUSTER_API void destroy_process_group();
MUSTER_API bool is_initialized();
// Throws muster::Error when no default group is initialized.
MUSTER_API ProcessGroup default_group();
MUSTER_API int get_rank();
MUSTER_API int get_world_size();
MUSTER_API int get_local_rank();

}  // namespace muster
