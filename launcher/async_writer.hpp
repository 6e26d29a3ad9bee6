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
// - drain() waits, bounded, for everything queued to be written; what a sink
//   will not take by then is dropped, so the agent can always exit.
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
  ~AsyncWriter();  // drains for at most kExitDrain, then abandons what is left
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  static constexpr std::chrono::milliseconds kExitDrain{2000};

  // Registers fd under a name for reports. With owned, the fd is closed once
  // release() was called and its bytes are written.
  void add(int fd, std::string name, bool owned);
  void release(int fd);
  void push(int fd, std::string_view bytes);
  bool full(int fd) const;
  void when_room(int fd, std::function<void()> callback);
  // Waits up to limit for every queue to empty; false if something is left.
  bool drain(std::chrono::milliseconds limit);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace muster::launcher
