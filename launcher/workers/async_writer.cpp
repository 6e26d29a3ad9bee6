#include "async_writer.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace muster::launcher {
namespace {

// One write() takes at most this much of a queue (whole pushes only).
constexpr std::size_t kBatch = 64 * 1024;

using Clock = std::chrono::steady_clock;

// Writes all of text to fd by `deadline`, or gives up; never blocks past it,
// even on a descriptor in blocking mode (a console): it waits with poll and
// writes at most PIPE_BUF bytes at a time, which a pipe with room takes whole.
bool write_by(int fd, std::string_view text, Clock::time_point deadline) {
  while (!text.empty()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left < 0) return false;
    pollfd pfd{fd, POLLOUT, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 100)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (ready > 0 && (pfd.revents & (POLLERR | POLLNVAL)))) return false;
    if (ready == 0) continue;
    ssize_t w = ::write(fd, text.data(), std::min<std::size_t>(text.size(), PIPE_BUF));
    if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (w <= 0) return false;
    text.remove_prefix(static_cast<std::size_t>(w));
  }
  return true;
}

}  // namespace

struct AsyncWriter::State {
  State(boost::asio::io_context& io, ErrorHandler on_error, std::size_t capacity)
      : io(io), on_error(std::move(on_error)), capacity(capacity) {}

  struct Sink {
    int fd = -1;
    std::string name;
    bool owned = false;
    bool released = false;
    bool failed = false;
    std::deque<std::pair<uint64_t, std::string>> queue;  // (sequence number, bytes)
    std::size_t bytes = 0;
    uint64_t pushed = 0;   // sequence number of the last push
    uint64_t written = 0;  // every push up to this one is written
    std::deque<std::pair<uint64_t, std::string>> finals;  // push_final's, until written
    std::vector<std::function<void()>> waiters;
  };

  boost::asio::io_context& io;
  ErrorHandler on_error;
  std::size_t capacity;
  std::mutex mutex;
  std::condition_variable work;
  std::condition_variable idle;
  std::map<int, Sink> sinks;  // by Sink id, in the order added
  int next_id = 0;
  int busy = -1;  // the sink being written outside the lock
  bool stop = false;
  bool abandoned = false;  // the owner is gone: post nothing more to io
  bool finished = false;
  int stuck = -1;  // the sink the abandoned thread was blocked on
  std::atomic<uint64_t> progress{0};  // writes that took bytes, for drain()
  std::thread thread;

  bool all_empty() const {
    for (const auto& [id, s] : sinks) {
      if (!s.queue.empty()) return false;
    }
    return busy < 0;
  }

  Sink* find(int id) {
    auto it = sinks.find(id);
    return it == sinks.end() ? nullptr : &it->second;
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
        if (it->second.owned) ::close(it->second.fd);
        it = sinks.erase(it);
      } else {
        ++it;
      }
    }
  }

  void run() {
    std::unique_lock lock(mutex);
    int last = -1;
    while (true) {
      retire_released();
      // Round robin over the sinks with something queued.
      auto next = sinks.upper_bound(last);
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
      const int id = pick->first;
      last = id;
      Sink& sink = pick->second;
      const int fd = sink.fd;
      std::string batch = std::move(sink.queue.front().second);
      uint64_t batch_last = sink.queue.front().first;
      sink.queue.pop_front();
      while (!sink.queue.empty() && batch.size() + sink.queue.front().second.size() <= kBatch) {
        batch += sink.queue.front().second;
        batch_last = sink.queue.front().first;
        sink.queue.pop_front();
      }
      busy = id;
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
      busy = -1;
      auto it = sinks.find(id);
      if (it == sinks.end()) continue;
      Sink& s = it->second;
      s.bytes -= std::min(s.bytes, batch.size());
      if (error == 0) {
        s.written = batch_last;
        while (!s.finals.empty() && s.finals.front().first <= s.written) s.finals.pop_front();
      } else if (!s.failed) {
        s.failed = true;
        s.queue.clear();
        s.finals.clear();
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

AsyncWriter::~AsyncWriter() { finish(kExitDrain); }

AsyncWriter::Leftover AsyncWriter::finish(std::chrono::milliseconds limit) {
  Leftover left;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->finished) return left;
    state_->finished = true;
  }
  const bool drained = drain(std::min(limit, kExitStall), limit);
  std::unique_lock lock(state_->mutex);
  state_->stop = true;
  if (drained) {
    // The files close once written; the console stays, for what is said after the end.
    for (auto& [id, s] : state_->sinks) {
      if (s.owned) s.released = true;
    }
    state_->work.notify_all();
    lock.unlock();
    state_->thread.join();
    return left;
  }
  // Out of time: what is queued is dropped, and the thread takes no more.
  std::vector<std::pair<int, std::string>> finals;  // (sink id, text)
  for (auto& [id, s] : state_->sinks) {
    if (s.bytes > 0) left.dropped.push_back({s.name, s.bytes});
    s.queue.clear();
    s.bytes = 0;
    if (!s.released) {
      for (auto& [seq, text] : s.finals) finals.emplace_back(id, std::move(text));
    }
    s.finals.clear();
  }
  state_->work.notify_all();
  // A write under way may just be slow: give it a moment to end before its
  // sink is taken for stuck (a console that takes nothing).
  state_->idle.wait_for(lock, kFinalWriteWait, [this] { return state_->busy < 0; });
  state_->stuck = state_->busy;
  const bool stuck = state_->stuck >= 0;
  state_->abandoned = stuck;
  std::vector<std::pair<int, std::string>> writable;  // (fd, text)
  for (auto& [id, text] : finals) {
    if (id != state_->stuck) writable.emplace_back(state_->sinks.at(id).fd, std::move(text));
  }
  lock.unlock();
  if (stuck) {
    // Blocked in a write that never returns: leave it; the process exits around it.
    state_->thread.detach();
  } else {
    state_->thread.join();
  }
  for (const auto& [fd, text] : writable) write_by(fd, text, Clock::now() + kFinalWriteWait);
  return left;
}

bool AsyncWriter::finished() const {
  std::lock_guard lock(state_->mutex);
  return state_->finished;
}

bool AsyncWriter::write_after_finish(Sink sink, std::string_view text) {
  int fd = -1;
  {
    std::lock_guard lock(state_->mutex);
    State::Sink* s = state_->find(sink.id_);
    if (!state_->finished || s == nullptr || s->released || sink.id_ == state_->stuck) return false;
    fd = s->fd;
  }
  return write_by(fd, text, Clock::now() + kFinalWriteWait);
}

AsyncWriter::Sink AsyncWriter::add_borrowed(int fd, std::string name) {
  std::lock_guard lock(state_->mutex);
  int id = state_->next_id++;
  auto& s = state_->sinks[id];
  s.fd = fd;
  s.name = std::move(name);
  return Sink(id);
}

AsyncWriter::Sink AsyncWriter::add_owned(net::UniqueFd fd, std::string name) {
  Sink sink = add_borrowed(fd.get(), std::move(name));
  std::lock_guard lock(state_->mutex);
  state_->sinks[sink.id_].owned = true;
  [[maybe_unused]] int owned_now = fd.release();  // closed by retire_released()
  return sink;
}

void AsyncWriter::release(Sink sink) {
  std::lock_guard lock(state_->mutex);
  if (State::Sink* s = state_->find(sink.id_)) {
    s->released = true;
    state_->work.notify_all();
  }
}

void AsyncWriter::push(Sink sink, std::string_view bytes) {
  if (bytes.empty()) return;
  std::lock_guard lock(state_->mutex);
  State::Sink* s = state_->find(sink.id_);
  if (s == nullptr || s->failed || state_->stop) return;
  s->queue.emplace_back(++s->pushed, bytes);
  s->bytes += bytes.size();
  state_->work.notify_all();
}

void AsyncWriter::push_final(Sink sink, std::string_view bytes) {
  if (bytes.empty()) return;
  std::lock_guard lock(state_->mutex);
  State::Sink* s = state_->find(sink.id_);
  if (s == nullptr || s->failed || state_->stop) return;
  s->queue.emplace_back(++s->pushed, bytes);
  s->finals.emplace_back(s->pushed, bytes);
  s->bytes += bytes.size();
  state_->work.notify_all();
}

bool AsyncWriter::full(Sink sink) const {
  std::lock_guard lock(state_->mutex);
  const State::Sink* s = state_->find(sink.id_);
  return s != nullptr && !s->failed && s->bytes >= state_->capacity;
}

std::size_t AsyncWriter::queued(Sink sink) const {
  std::lock_guard lock(state_->mutex);
  const State::Sink* s = state_->find(sink.id_);
  return s == nullptr || s->failed ? 0 : s->bytes;
}

void AsyncWriter::when_room(Sink sink, std::function<void()> callback) {
  std::lock_guard lock(state_->mutex);
  State::Sink* s = state_->find(sink.id_);
  if (s == nullptr || s->failed || s->bytes <= state_->capacity / 2) {
    state_->post(std::move(callback));
    return;
  }
  s->waiters.push_back(std::move(callback));
}

bool AsyncWriter::drain(std::chrono::milliseconds stalled_limit, std::chrono::milliseconds total_limit) {
  auto start = Clock::now();
  std::unique_lock lock(state_->mutex);
  state_->work.notify_all();
  uint64_t seen = state_->progress.load();
  auto last_progress = start;
  while (!state_->all_empty()) {
    auto now = Clock::now();
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
