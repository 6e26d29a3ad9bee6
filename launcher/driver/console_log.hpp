// The agent's stderr, shared by its log lines (log::) and its messages
// (errors, failure reports, events), written through the AsyncWriter so a
// console nobody reads never blocks the event loop. While stderr's buffer is
// full, log lines are dropped and counted, so such a console cannot make the
// agent's memory grow; the next line that fits says how many were dropped.
// Messages (say) are always queued: they are few and they are the point.
// Once the writer has finished (the agent's exit), lines go straight to
// stderr, each waiting for it briefly (AsyncWriter::write_after_finish).
#pragma once

#include <cstdint>
#include <string_view>

#include "async_writer.hpp"

namespace muster::launcher {

class ConsoleLog {
 public:
  // Installs itself as log::'s writer until destroyed.
  ConsoleLog(AsyncWriter& writer, AsyncWriter::Sink stderr_sink);
  ~ConsoleLog();
  ConsoleLog(const ConsoleLog&) = delete;
  ConsoleLog& operator=(const ConsoleLog&) = delete;

  void say(std::string_view text);
  // From now on say() queues the run's final messages (AsyncWriter::push_final):
  // should the console take nothing at exit, they are what is still tried.
  void ending() { ending_ = true; }
  // Log lines dropped over the agent's life (--metrics-listen).
  uint64_t dropped_total() const { return dropped_total_; }

 private:
  void log_line(std::string_view line);

  AsyncWriter& writer_;
  AsyncWriter::Sink sink_;
  bool ending_ = false;
  std::size_t dropped_ = 0;  // since the last line that got through
  uint64_t dropped_total_ = 0;
};

}  // namespace muster::launcher
