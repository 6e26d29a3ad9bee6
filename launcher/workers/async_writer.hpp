// Writes to file descriptors from a thread of its own, so that a console
// nobody reads, a slow pipe or a slow disk never blocks the agent's event
// loop: the store, the rendezvous, heartbeats, signals and supervision go on
// whatever the sinks do.
//
// Contract:
// - push() queues bytes for one fd and never blocks; each push is written
//   whole and in order, so lines pushed whole never interleave mid-line.
// - Each fd has a bounded buffer. A producer that sees full() stops producing
//   (the output pump stops reading the worker's pipe, and the worker blocks on
//   its own write, as under a plain terminal) and asks when_room(), which runs
//   its callback on the event loop once the buffer has drained to half.
// - A write that fails (disk full, read-only, a closed pipe) is reported once
//   through on_error, on the event loop, with the sink's name; later bytes for
//   that fd are dropped and the job goes on.
// - drain() waits for everything queued to be written while the sinks keep
//   taking bytes, bounded; what a sink will not take is dropped, so the agent
//   can always exit. A descriptor that another process made non-blocking is
//   waited on (poll), not given up.
// - One thread serves every sink: a console that takes nothing holds back the
//   others too (the workers that tee to it are held back anyway).
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace muster::launcher {

class AsyncWriter {
 public:
  // Bytes queued per fd before full() says so.
  static constexpr std::size_t kDefaultCapacity = 1024 * 1024;
  using ErrorHandler = std::function<void(const std::string& sink_name, int error_number)>;

  AsyncWriter(boost::asio::io_context& io, ErrorHandler on_error, std::size_t capacity = kDefaultCapacity);
  // Drains (kExitStall without progress, kExitDrain in all at most), then
  // abandons what is left.
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  static constexpr std::chrono::milliseconds kExitStall{5000};
  static constexpr std::chrono::milliseconds kExitDrain{60000};

  // Registers fd under a name for reports. With owned, the fd is closed once
  // release() was called and its bytes are written.
  void add(int fd, std::string name, bool owned);
  void release(int fd);
  void push(int fd, std::string_view bytes);
  bool full(int fd) const;
  void when_room(int fd, std::function<void()> callback);
  // Waits for every queue to empty, giving up after stalled_limit without a
  // byte written or total_limit in all; false if something is left.
  bool drain(std::chrono::milliseconds stalled_limit, std::chrono::milliseconds total_limit);
  // Bytes queued for fd now (0 for an unknown or failed one).
  std::size_t queued(int fd) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace muster::launcher
