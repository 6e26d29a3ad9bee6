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
//   taking bytes, bounded; finish() does so once more at the end, within the
//   limit its owner gives (the agent: --shutdown-timeout), and what a sink
//   will not take is then dropped, so the agent can always exit on time; it
//   says which sinks lost how much. A descriptor that another process made
//   non-blocking is waited on (poll), not given up.
// - Sinks are handles (Sink), not descriptor numbers; whether the writer
//   closes a descriptor is decided by how it was added (add_owned takes a
//   UniqueFd, add_borrowed an fd it never closes).
// - One thread serves every sink: a console that takes nothing holds back the
//   others too (the workers that tee to it are held back anyway).
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "muster/net/unique_fd.hpp"

namespace muster::launcher {

class AsyncWriter {
 public:
  // Bytes queued per sink before full() says so.
  static constexpr std::size_t kDefaultCapacity = 1024 * 1024;
  using ErrorHandler = std::function<void(const std::string& sink_name, int error_number)>;

  // A registered descriptor. Default-constructed: none (pushes to it are dropped).
  class Sink {
   public:
    Sink() = default;
    explicit operator bool() const { return id_ >= 0; }
    bool operator==(const Sink& o) const { return id_ == o.id_; }

   private:
    friend class AsyncWriter;
    explicit Sink(int id) : id_(id) {}
    int id_ = -1;
  };

  // What finish() could not write.
  struct Leftover {
    struct Sink {
      std::string name;
      std::size_t bytes = 0;  // dropped, final messages included
    };
    std::vector<Sink> dropped;  // empty when everything was written
  };

  AsyncWriter(boost::asio::io_context& io, ErrorHandler on_error, std::size_t capacity = kDefaultCapacity);
  // finish(kExitDrain) unless finish() ran.
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Without progress for this long, finish() gives up on what is left.
  static constexpr std::chrono::milliseconds kExitStall{5000};
  static constexpr std::chrono::milliseconds kExitDrain{60000};
  // How long a final message waits for its descriptor to take it, once
  // finish() has given up on the writer thread.
  static constexpr std::chrono::milliseconds kFinalWriteWait{200};

  // A descriptor the writer writes to and never closes (the console).
  Sink add_borrowed(int fd, std::string name);
  // A descriptor the writer owns: closed once released and written.
  Sink add_owned(net::UniqueFd fd, std::string name);
  void release(Sink sink);
  void push(Sink sink, std::string_view bytes);
  // A message the run ends with (the failure report): queued as push() does,
  // and, should finish() have to give up on the sink's queue, written
  // straight to its descriptor before the note of what was dropped (unless
  // the writer thread is stuck on that very descriptor).
  void push_final(Sink sink, std::string_view bytes);
  bool full(Sink sink) const;
  void when_room(Sink sink, std::function<void()> callback);
  // Waits for every queue to empty, giving up after stalled_limit without a
  // byte written or total_limit in all; false if something is left.
  bool drain(std::chrono::milliseconds stalled_limit, std::chrono::milliseconds total_limit);
  // Bytes queued for the sink now (0 for none, or a failed one).
  std::size_t queued(Sink sink) const;

  // The end: drains for at most `limit` (and kExitStall without progress),
  // then stops the writer thread, or abandons it blocked in a write that
  // takes nothing (a console nobody reads) and drops every queue. The final
  // messages of the sinks the thread is not stuck on are then written
  // straight, each waiting at most kFinalWriteWait. Nothing is written after.
  Leftover finish(std::chrono::milliseconds limit);
  bool finished() const;
  // Writes text straight to the sink's descriptor after finish(), waiting at
  // most kFinalWriteWait; false if it did not all go (or the writer thread is
  // stuck on that descriptor, or the sink is gone).
  bool write_after_finish(Sink sink, std::string_view text);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace muster::launcher
