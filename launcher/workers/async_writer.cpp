#include "async_writer.hpp"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace muster::launcher {
namespace {
// One write() takes at most this much of a queue (whole pushes only).
constexpr std::size_t kBatch = 64 * 1024;
}  // namespace

struct AsyncWriter::State {
  State(boost::asio::io_context& io, ErrorHandler on_error, std::size_t capacity)
      : io(io), on_error(std::move(on_error)), capacity(capacity) {}

  struct Sink {
    std::string name;
    bool owned = false;
    bool released = false;
    bool failed = false;
    std::deque<std::string> queue;
    std::size_t bytes = 0;
    std::vector<std::function<void()>> waiters;
  };

  boost::asio::io_context& io;
  ErrorHandler on_error;
  std::size_t capacity;
  std::mutex mutex;
  std::condition_variable work;
  std::condition_variable idle;
  std::map<int, Sink> sinks;
  bool busy = false;
  bool stop = false;
  bool abandoned = false;  // the owner is gone: post nothing more to io
  std::atomic<uint64_t> progress{0};  // writes that took bytes, for drain()
  std::thread thread;

  bool all_empty() const {
    for (const auto& [fd, s] : sinks) {
      if (!s.queue.empty()) return false;
    }
    return !busy;
  }

  void post(std::function<void()> f) {
    if (!abandoned) boost::asio::post(io, std::move(f));
  }

  void wake_waiters(Sink& s) {
    if (s.bytes > capacity / 2 && !s.failed) return;
    for (auto& w : s.waiters) post(std::move(w));
    s.waiters.clear();
  }

  // Closes and forgets released sinks with nothing left to write.
  void retire_released() {
    for (auto it = sinks.begin(); it != sinks.end();) {
      if (it->second.released && it->second.queue.empty()) {
        if (it->second.owned) ::close(it->first);
        it = sinks.erase(it);
      } else {
        ++it;
      }
    }
  }

  void run() {
    std::unique_lock lock(mutex);
    int last_fd = -1;
    while (true) {
      retire_released();
      // Round robin over the fds with something queued.
      auto next = sinks.upper_bound(last_fd);
      auto pick = sinks.end();
      for (int pass = 0; pass < 2 && pick == sinks.end(); ++pass) {
        for (auto it = pass == 0 ? next : sinks.begin(); it != sinks.end(); ++it) {
          if (!it->second.queue.empty()) {
            pick = it;
            break;
          }
        }
      }
      if (pick == sinks.end()) {
        idle.notify_all();
        if (stop) return;
        work.wait(lock);
        continue;
      }
      int fd = pick->first;
      last_fd = fd;
      Sink& sink = pick->second;
      std::string batch = std::move(sink.queue.front());
      sink.queue.pop_front();
      while (!sink.queue.empty() && batch.size() + sink.queue.front().size() <= kBatch) {
        batch += sink.queue.front();
        sink.queue.pop_front();
      }
      busy = true;
      lock.unlock();
      int error = 0;
      const char* p = batch.data();
      std::size_t left = batch.size();
      while (left > 0) {
        ssize_t w = ::write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          // A descriptor someone else made non-blocking (a pty, a CI runner's
          // pipe): wait until it takes more, as a blocking write would.
          pollfd pfd{fd, POLLOUT, 0};
          ::poll(&pfd, 1, 100);
          continue;
        }
        if (w <= 0) {
          error = w < 0 ? errno : EIO;
          break;
        }
        p += w;
        left -= static_cast<std::size_t>(w);
        progress.store(progress.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      }
      lock.lock();
      busy = false;
      auto it = sinks.find(fd);
      if (it == sinks.end()) continue;
      Sink& s = it->second;
      s.bytes -= std::min(s.bytes, batch.size());
      if (error != 0 && !s.failed) {
        s.failed = true;
        s.queue.clear();
        s.bytes = 0;
        if (on_error) {
          std::string name = s.name;
          auto report = on_error;
          post([report, name, error] { report(name, error); });
        }
      }
      wake_waiters(s);
    }
  }
};

AsyncWriter::AsyncWriter(boost::asio::io_context& io, ErrorHandler on_error, std::size_t capacity)
    : state_(std::make_shared<State>(io, std::move(on_error), capacity)) {
  // The thread holds the state too: if it must be abandoned in a write that
  // never returns, nothing it touches is freed under it.
  auto state = state_;
  state_->thread = std::thread([state] { state->run(); });
}

AsyncWriter::~AsyncWriter() {
  bool drained = drain(kExitStall, kExitDrain);
  std::unique_lock lock(state_->mutex);
  state_->stop = true;
  if (!drained) {
    // A sink that takes nothing (a console nobody reads): leave the thread
    // blocked in its write; the process exits around it.
    state_->abandoned = true;
    for (auto& [fd, s] : state_->sinks) s.queue.clear();
    state_->work.notify_all();
    lock.unlock();
    state_->thread.detach();
    return;
  }
  for (auto& [fd, s] : state_->sinks) s.released = true;
  state_->work.notify_all();
  lock.unlock();
  state_->thread.join();
}

void AsyncWriter::add(int fd, std::string name, bool owned) {
  std::lock_guard lock(state_->mutex);
  auto& s = state_->sinks[fd];
  s.name = std::move(name);
  s.owned = owned;
}

void AsyncWriter::release(int fd) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->sinks.find(fd);
  if (it == state_->sinks.end()) return;
  it->second.released = true;
  state_->work.notify_all();
}

void AsyncWriter::push(int fd, std::string_view bytes) {
  if (bytes.empty()) return;
  std::lock_guard lock(state_->mutex);
  auto it = state_->sinks.find(fd);
  if (it == state_->sinks.end() || it->second.failed) return;
  it->second.queue.emplace_back(bytes);
  it->second.bytes += bytes.size();
  state_->work.notify_all();
}

bool AsyncWriter::full(int fd) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->sinks.find(fd);
  return it != state_->sinks.end() && !it->second.failed && it->second.bytes >= state_->capacity;
}

std::size_t AsyncWriter::queued(int fd) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->sinks.find(fd);
  return it == state_->sinks.end() || it->second.failed ? 0 : it->second.bytes;
}

void AsyncWriter::when_room(int fd, std::function<void()> callback) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->sinks.find(fd);
  if (it == state_->sinks.end() || it->second.failed || it->second.bytes <= state_->capacity / 2) {
    state_->post(std::move(callback));
    return;
  }
  it->second.waiters.push_back(std::move(callback));
}

bool AsyncWriter::drain(std::chrono::milliseconds stalled_limit, std::chrono::milliseconds total_limit) {
  auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(state_->mutex);
  state_->work.notify_all();
  uint64_t seen = state_->progress.load();
  auto last_progress = start;
  while (!state_->all_empty()) {
    auto now = std::chrono::steady_clock::now();
    uint64_t p = state_->progress.load();
    if (p != seen) {
      seen = p;
      last_progress = now;
    }
    if (now - last_progress >= stalled_limit || now - start >= total_limit) return false;
    state_->idle.wait_for(lock, std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace muster::launcher
