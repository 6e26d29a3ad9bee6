#include "shm.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "reduce.hpp"

namespace muster::detail {
namespace {

constexpr std::size_t kLine = 128;  // two cache lines: no false sharing with the adjacent-line prefetcher
constexpr uint64_t kMagic = 0x6d75737465727368ull;  // "mustersh"
// Below this many bytes per chunk every rank reduces the whole chunk itself:
// one wait per chunk instead of two.
constexpr std::size_t kOnePhaseBytes = 32 * 1024;

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

uint64_t load(const uint64_t* p) { return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(p)).load(std::memory_order_acquire); }
void store(uint64_t* p, uint64_t v) { std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release); }

std::string errno_text() { return std::strerror(errno); }

// [lo, hi) of local rank j's share of n elements, shares rounded to 64 bytes.
std::pair<std::size_t, std::size_t> share(std::size_t n, int j, int parts, std::size_t es) {
  std::size_t unit = std::max<std::size_t>(1, 64 / es);
  std::size_t per = align_up((n + parts - 1) / parts, unit);
  std::size_t lo = std::min(n, per * j);
  return {lo, std::min(n, lo + per)};
}

}  // namespace

std::size_t ShmNode::segment_bytes(int local_size, std::size_t slot_bytes) {
  return align_up(kLine * (2 + 2 * local_size), 4096) + 2 * static_cast<std::size_t>(local_size) * slot_bytes;
}

ShmNode::ShmNode(const std::string& name, bool create, int local_rank, int local_size, std::size_t slot_bytes,
                 const std::vector<pid_t>& pids, std::vector<int> global_ranks)
    : local_rank_(local_rank),
      local_size_(local_size),
      slot_bytes_(slot_bytes),
      bytes_(segment_bytes(local_size, slot_bytes)),
      pids_(pids),
      global_ranks_(std::move(global_ranks)) {
  net::UniqueFd fd(create ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600)
                         : shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd) {
    throw Error("cannot " + std::string(create ? "create" : "open") + " the node's shared memory /dev/shm" + name +
                ": " + errno_text() +
                (create ? "; check that /dev/shm is mounted and has room"
                        : "; ranks that share a host name and boot id but not /dev/shm (containers on one host) "
                          "need MUSTER_NODE_ID set per container, or MUSTER_CPU_TRANSPORT=tcp"));
  }
  // posix_fallocate reserves the pages: a full tmpfs is an error here, not a
  // SIGBUS in the first collective.
  int alloc = create ? posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes_)) : 0;
  if (create && alloc != 0) errno = alloc;
  if (create && (alloc != 0 || ftruncate(fd.get(), static_cast<off_t>(bytes_)) != 0)) {
    std::string why = errno_text();
    fd.reset();
    shm_unlink(name.c_str());
    throw Error("cannot size the node's shared memory /dev/shm" + name + " to " + std::to_string(bytes_) +
                " bytes: " + why + "; /dev/shm may be too small (MUSTER_SHM_SLOT_BYTES makes it smaller)");
  }
  struct stat st {};
  if (!create && fstat(fd.get(), &st) != 0) {
    std::string why = errno_text();
    throw Error("cannot read the size of the node's shared memory /dev/shm" + name + ": " + why);
  }
  if (!create && static_cast<std::size_t>(st.st_size) != bytes_) {
    throw Error("the node's shared memory /dev/shm" + name + " has " + std::to_string(st.st_size) +
                " bytes, expected " + std::to_string(bytes_) + " (ranks disagree on MUSTER_SHM_SLOT_BYTES?)");
  }
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  fd.reset();  // the mapping keeps the segment
  if (p == MAP_FAILED) {
    if (create) shm_unlink(name.c_str());
    throw Error("cannot map the node's shared memory /dev/shm" + name + ": " + errno_text());
  }
  base_ = static_cast<char*>(p);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  spins_ = local_size_ <= cores ? 2048 : 0;
  if (create) store(line(0), kMagic);
  for (pid_t pid : pids_) {
    // None (old kernel, or gone already): kill(pid, 0) instead.
    pidfds_.emplace_back(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  }
}

ShmNode::~ShmNode() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

void ShmNode::unlink(const std::string& name) { shm_unlink(name.c_str()); }

uint64_t* ShmNode::line(std::size_t index) const { return reinterpret_cast<uint64_t*>(base_ + index * kLine); }

char* ShmNode::slot(uint64_t step, int local) const {
  std::size_t data = align_up(kLine * (2 + 2 * local_size_), 4096);
  return base_ + data + ((step & 1) * local_size_ + local) * slot_bytes_;
}

void ShmNode::abort(int global_rank) {
  if (base_ == nullptr) return;
  uint64_t expected = 0;
  std::atomic_ref<uint64_t>(*line(1)).compare_exchange_strong(expected, static_cast<uint64_t>(global_rank) + 1);
}

void ShmNode::check_peers() {
  uint64_t failed = load(line(1));
  if (failed != 0) {
    throw Error("rank " + std::to_string(failed - 1) + " on this node failed or exited, so this collective cannot complete");
  }
  for (int j = 0; j < local_size_; ++j) {
    if (j == local_rank_) continue;
    bool gone;
    if (pidfds_[j]) {
      pollfd p{pidfds_[j].get(), POLLIN, 0};
      gone = poll(&p, 1, 0) == 1;
    } else {
      gone = kill(pids_[j], 0) != 0 && errno == ESRCH;
    }
    if (gone) {
      abort(global_ranks_[j]);  // the others then name this rank too
      throw Error("rank " + std::to_string(global_ranks_[j]) + " (pid " + std::to_string(pids_[j]) +
                  ") on this node exited");
    }
  }
}

void ShmNode::arrive(uint64_t step) { store(arrived(local_rank_), step); }
void ShmNode::mark_done(uint64_t step) { store(done(local_rank_), step); }

void ShmNode::wait_all(uint64_t* (ShmNode::*counter)(int) const, uint64_t step, Clock::time_point deadline,
                       const char* what) {
  wait_until(
      [&] {
        for (int j = 0; j < local_size_; ++j)
          if (load((this->*counter)(j)) < step) return false;
        return true;
      },
      [&] { check_peers(); }, deadline, [&] { return std::string("waiting for this node's ranks to ") + what; },
      spins_);
}

void ShmNode::wait_arrived(uint64_t step, Clock::time_point deadline, const char* what) {
  wait_all(&ShmNode::arrived, step, deadline, what);
}
void ShmNode::wait_done(uint64_t step, Clock::time_point deadline, const char* what) {
  wait_all(&ShmNode::done, step, deadline, what);
}

void ShmNode::all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, int divisor,
                         Clock::time_point deadline, const ShareStep& across) {
  const std::size_t es = element_size(type);
  const std::size_t chunk = slot_bytes_ / es;
  char* bytes = static_cast<char*>(data);
  for (std::size_t off = 0; off < count; off += chunk) {
    const std::size_t n = std::min(chunk, count - off);
    const uint64_t step = ++step_;
    char* mine = bytes + off * es;
    if (!across && n * es <= kOnePhaseBytes) {
      // Small: every rank reduces the whole chunk, in the same order (equal
      // results everywhere), with one wait instead of two.
      std::memcpy(slot(step, local_rank_), mine, n * es);
      arrive(step);
      wait_arrived(step, deadline, "contribute to all_reduce");
      combine(type, op, mine, slot(step, 0), slot(step, 1), n);
      for (int j = 2; j < local_size_; ++j) combine(type, op, mine, mine, slot(step, j), n);
      finish(type, op, mine, n, divisor);
      continue;
    }
    // Reduce-scatter, then all-gather, through the slots. The peers read only
    // the shares they own from this rank's slot, so this rank's own share is
    // never copied in: it is reduced straight from the caller's buffer.
    char* own = slot(step, local_rank_);
    for (int j = 0; j < local_size_; ++j) {
      if (j == local_rank_) continue;
      auto [l, h] = share(n, j, local_size_, es);
      if (h > l) std::memcpy(own + l * es, mine + l * es, (h - l) * es);
    }
    arrive(step);
    wait_arrived(step, deadline, "contribute to all_reduce");
    auto [lo, hi] = share(n, local_rank_, local_size_, es);
    if (hi > lo) {
      char* acc = mine + lo * es;
      for (int j = 0; j < local_size_; ++j) {
        if (j != local_rank_) combine(type, op, acc, acc, slot(step, j) + lo * es, hi - lo);
      }
      if (across) {
        across(acc, hi - lo);
      } else {
        finish(type, op, acc, hi - lo, divisor);
      }
      std::memcpy(own + lo * es, acc, (hi - lo) * es);  // the result, for the peers
    } else if (across) {
      across(nullptr, 0);  // an empty share still takes its turn across the nodes
    }
    mark_done(step);
    wait_done(step, deadline, "reduce their share of all_reduce");
    for (int j = 0; j < local_size_; ++j) {
      if (j == local_rank_) continue;
      auto [l, h] = share(n, j, local_size_, es);
      if (h > l) std::memcpy(mine + l * es, slot(step, j) + l * es, (h - l) * es);
    }
  }
}

void ShmNode::broadcast(void* data, std::size_t bytes, int root, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  for (std::size_t off = 0; off < bytes; off += slot_bytes_) {
    const std::size_t n = std::min(slot_bytes_, bytes - off);
    const uint64_t step = ++step_;
    if (local_rank_ == root) std::memcpy(slot(step, root), p + off, n);
    arrive(step);
    wait_arrived(step, deadline, "reach broadcast");
    if (local_rank_ != root) std::memcpy(p + off, slot(step, root), n);
  }
}

void ShmNode::all_gather(const void* in, void* out, std::size_t bytes, Clock::time_point deadline) {
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  if (bytes == 0) return;
  for (std::size_t off = 0; off < bytes; off += slot_bytes_) {
    const std::size_t n = std::min(slot_bytes_, bytes - off);
    const uint64_t step = ++step_;
    std::memcpy(slot(step, local_rank_), src + off, n);
    arrive(step);
    wait_arrived(step, deadline, "contribute to all_gather");
    for (int j = 0; j < local_size_; ++j) std::memcpy(dst + j * bytes + off, slot(step, j), n);
  }
}

void ShmNode::reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                             Clock::time_point deadline) {
  const std::size_t es = element_size(type);
  // Each step carries a piece of every block: local_size pieces per slot.
  if (slot_bytes_ / es < static_cast<std::size_t>(local_size_)) {
    throw Error("reduce_scatter needs room for one element per local rank in each slot: raise MUSTER_SHM_SLOT_BYTES "
                "above " + std::to_string(slot_bytes_) + " for " + std::to_string(local_size_) + " ranks");
  }
  const std::size_t piece = slot_bytes_ / es / local_size_;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (std::size_t off = 0; off < count; off += piece) {
    const std::size_t n = std::min(piece, count - off);
    const uint64_t step = ++step_;
    char* mine = slot(step, local_rank_);
    for (int j = 0; j < local_size_; ++j) std::memcpy(mine + j * piece * es, src + (j * count + off) * es, n * es);
    arrive(step);
    wait_arrived(step, deadline, "contribute to reduce_scatter");
    char* result = dst + off * es;
    const std::size_t at = local_rank_ * piece * es;
    combine(type, op, result, slot(step, 0) + at, slot(step, 1) + at, n);
    for (int j = 2; j < local_size_; ++j) combine(type, op, result, result, slot(step, j) + at, n);
    finish(type, op, result, n, local_size_);
  }
}

void ShmNode::barrier(Clock::time_point deadline) {
  const uint64_t step = ++step_;
  arrive(step);
  wait_arrived(step, deadline, "reach barrier");
}

}  // namespace muster::detail
