// The public side of a process group: creating it, its collectives on CPU
// buffers, and the process's default group. Forming it is group_bootstrap.cpp.
#include "muster/process_group.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "group_impl.hpp"
#include "reduce.hpp"

namespace muster {

using detail::Clock;

namespace {

// The process's one piece of shared state: the default group, and the count
// of unnamed groups made so far (which names the next one).
struct Registry {
  std::mutex mutex;
  ProcessGroup default_group;  // guarded by mutex
  std::atomic<int> unnamed_groups{0};
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

namespace detail {

[[noreturn]] void throw_status(const Status& st, const std::string& context) {
  std::string msg = context + ": " + st.message();
  if (st.code() == Code::timeout) throw TimeoutError(msg);
  throw Error(msg);
}

const char* plan_transport(Plan plan) {
  switch (plan) {
    case Plan::single: return "none";
    case Plan::shared_memory: return "shm";
    case Plan::ring: return "tcp";
    case Plan::hierarchical: return "shm+tcp";
  }
  return "none";
}

std::string next_unnamed_group_name() { return "pg" + std::to_string(registry().unnamed_groups.fetch_add(1)); }

}  // namespace detail

ProcessGroup ProcessGroup::create(const ProcessGroupOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->connect(options);
  return ProcessGroup(std::move(impl));
}

ProcessGroup::Impl& ProcessGroup::impl() const {
  if (!impl_) throw Error("muster: this ProcessGroup handle is empty (create one with muster::init_process_group)");
  if (impl_->destroyed) throw Error("muster: the process group was destroyed");
  return *impl_;
}

int ProcessGroup::rank() const { return impl().rank; }
int ProcessGroup::size() const { return impl().world; }
int ProcessGroup::local_rank() const { return impl().env_local_rank.value_or(impl().local_rank); }
int ProcessGroup::local_size() const { return impl().env_local_size.value_or(impl().local_size); }
int ProcessGroup::node_count() const { return impl().nodes; }
int ProcessGroup::restart_count() const { return impl().restart; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl().timeout; }
std::string ProcessGroup::transport() const { return detail::plan_transport(impl().plan); }

void ProcessGroup::check_span_sizes(const char* what, std::size_t small, std::size_t big) const {
  if (big != small * static_cast<std::size_t>(size())) {
    throw Error(std::string("muster: ") + what + ": the larger buffer must hold size() = " + std::to_string(size()) +
                " times the smaller one's " + std::to_string(small) + " elements, it holds " + std::to_string(big));
  }
}

namespace {

// Runs one collective: an unusable group refuses, a failure marks the group
// unusable, tells the node's ranks and the ring neighbours, and rethrows with
// the rank and the operation named.
template <typename F>
void run_collective(ProcessGroup::Impl& g, const std::string& what, F&& body) {
  if (!g.broken.empty()) {
    throw Error("muster: rank " + std::to_string(g.rank) + ": " + what +
                ": the process group is unusable after an earlier failure (" + g.broken +
                "); destroy it and let the launcher restart the job");
  }
  try {
    body();
  } catch (const TimeoutError& e) {
    g.broken = e.what();
    if (g.shm) g.shm->abort(g.rank);
    if (g.flat) g.flat->shut();
    if (g.cross) g.cross->shut();
    throw TimeoutError("muster: rank " + std::to_string(g.rank) + ": " + what + " timed out after " +
                       std::to_string(g.timeout.count()) + " ms: " + e.what());
  } catch (const Error& e) {
    g.broken = e.what();
    if (g.shm) g.shm->abort(g.rank);
    if (g.flat) g.flat->shut();
    if (g.cross) g.cross->shut();
    throw Error("muster: rank " + std::to_string(g.rank) + ": " + what + " failed: " + e.what());
  }
}

std::string describe(const char* op, std::size_t count, DataType type) {
  return std::string(op) + " of " + std::to_string(count) + " " + data_type_name(type);
}

void check_buffer(const void* p, std::size_t count, DataType type, const char* what) {
  if (count > 0 && p == nullptr) throw Error(std::string("muster: ") + what + ": a null buffer for " + std::to_string(count) + " elements");
  if (count > (SIZE_MAX / 16) / element_size(type)) throw Error(std::string("muster: ") + what + ": the element count overflows");
}

}  // namespace

void ProcessGroup::all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) {
  auto& g = impl();
  check_buffer(data, count, type, "all_reduce");
  run_collective(g, describe("all_reduce", count, type), [&] {
    const int divisor = op == ReduceOp::avg ? g.world : 1;
    auto until = g.deadline();
    switch (g.plan) {
      case detail::Plan::single: return;
      case detail::Plan::shared_memory: return g.shm->all_reduce(data, count, type, op, divisor, until);
      case detail::Plan::ring: return g.flat->all_reduce(data, count, type, op, divisor, until);
      case detail::Plan::hierarchical:
        return detail::hierarchical_all_reduce(*g.shm, *g.cross, data, count, type, op, divisor, until);
    }
  });
}

void ProcessGroup::broadcast(void* data, std::size_t count, DataType type, int root) {
  auto& g = impl();
  check_buffer(data, count, type, "broadcast");
  if (root < 0 || root >= g.world) {
    throw Error("muster: broadcast: root " + std::to_string(root) + " is outside [0, " + std::to_string(g.world) + ")");
  }
  run_collective(g, describe("broadcast", count, type), [&] {
    auto until = g.deadline();
    const std::size_t bytes = count * element_size(type);
    switch (g.plan) {
      case detail::Plan::single: return;
      case detail::Plan::shared_memory: return g.shm->broadcast(data, bytes, root, until);
      case detail::Plan::ring:
      case detail::Plan::hierarchical: return g.flat->broadcast(data, bytes, root, until);
    }
  });
}

void ProcessGroup::all_gather(const void* in, void* out, std::size_t count, DataType type) {
  auto& g = impl();
  check_buffer(in, count, type, "all_gather");
  check_buffer(out, count * g.world, type, "all_gather");
  run_collective(g, describe("all_gather", count, type), [&] {
    const std::size_t bytes = count * element_size(type);
    auto until = g.deadline();
    if (g.plan == detail::Plan::shared_memory) return g.shm->all_gather(in, out, bytes, until);
    char* o = static_cast<char*>(out);
    if (bytes > 0) std::memmove(o + g.rank * bytes, in, bytes);
    if (g.plan != detail::Plan::single && bytes > 0) g.flat->all_gather_in_place(out, bytes, until);
  });
}

void ProcessGroup::reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op) {
  auto& g = impl();
  check_buffer(in, count * g.world, type, "reduce_scatter");
  check_buffer(out, count, type, "reduce_scatter");
  run_collective(g, describe("reduce_scatter", count, type), [&] {
    auto until = g.deadline();
    const int divisor = op == ReduceOp::avg ? g.world : 1;
    if (g.plan == detail::Plan::single) {
      if (count > 0) std::memmove(out, in, count * element_size(type));
      return;
    }
    if (count == 0) return;
    if (g.plan == detail::Plan::shared_memory) return g.shm->reduce_scatter(in, out, count, type, op, until);
    g.flat->reduce_scatter(in, out, count, type, op, divisor, until);
  });
}

void ProcessGroup::barrier() {
  auto& g = impl();
  run_collective(g, "barrier", [&] {
    auto until = g.deadline();
    switch (g.plan) {
      case detail::Plan::single: return;
      case detail::Plan::shared_memory: return g.shm->barrier(until);
      case detail::Plan::ring:
      case detail::Plan::hierarchical: return g.flat->barrier(until);
    }
  });
}

void ProcessGroup::store_set(const std::string& key, const std::string& value) { impl().set("user/" + key, value); }

const std::string& ProcessGroup::name() const { return impl().name; }

std::string ProcessGroup::next_key(const std::string& kind) {
  auto& i = impl();
  std::lock_guard lock(i.key_mutex);
  return kind + "/" + std::to_string(i.key_counts[kind]++);
}
std::string ProcessGroup::store_get(const std::string& key) { return impl().get("user/" + key); }

void ProcessGroup::destroy() {
  if (!impl_ || impl_->destroyed) return;
  impl_->close();
  impl_->destroyed = true;
}

ProcessGroup init_process_group(const ProcessGroupOptions& options) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.default_group.valid()) {
    throw Error("muster: init_process_group was called twice; call destroy_process_group() first");
  }
  r.default_group = ProcessGroup::create(options);
  return r.default_group;
}

void destroy_process_group() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.default_group.valid()) r.default_group.destroy();
  r.default_group = ProcessGroup();
}

bool is_initialized() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  return r.default_group.valid();
}

ProcessGroup default_group() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.default_group.valid()) {
    throw Error("muster: the default process group is not initialized; call muster::init_process_group() first");
  }
  return r.default_group;
}

int get_rank() { return default_group().rank(); }
int get_world_size() { return default_group().size(); }
int get_local_rank() { return default_group().local_rank(); }

}  // namespace muster
