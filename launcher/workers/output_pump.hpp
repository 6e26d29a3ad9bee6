// Carries one tee'd stream of one worker: bytes from the worker's pipe go to
// its log file unchanged and, line by line with the rank's prefix, to the
// agent's console. Every write goes through the agent's AsyncWriter, so lines
// of different workers never interleave mid-line and a slow sink never blocks
// the event loop; while a sink's buffer is full the pump stops reading the
// pipe, and the worker waits on its own write.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "async_writer.hpp"
#include "line_splitter.hpp"
#include "muster/common/fd_io.hpp"

namespace muster::launcher {

struct PumpTargets {
  AsyncWriter* writer = nullptr;  // required when any sink below is set
  AsyncWriter::Sink file;      // the log file; released by the pump at its end
  AsyncWriter::Sink console;   // the agent's console
  std::string prefix;
  AsyncWriter::Sink filtered;  // lines matching a filter are copied here
  std::vector<std::string> filters;
  // The console gets the bytes as they come, unsplit and unprefixed (a
  // stream muster only watches: --worker-timeout without --tee).
  bool raw_console = false;
  // Called for every read that brought bytes (--worker-timeout's progress),
  // and with true when reading stops for a full sink, false when it goes on.
  std::function<void()> on_activity;
  std::function<void(bool)> on_blocked;
};

class OutputPump : public std::enable_shared_from_this<OutputPump> {
 public:
  OutputPump(boost::asio::io_context& io, int pipe_read_fd, PumpTargets targets);
  ~OutputPump();

  // on_eof runs once, when every writer has closed the pipe and everything
  // it carried has been passed on (a partial last line included).
  void start(std::function<void()> on_eof);
  // Gives up on a pipe whose writer will not go away: flushes what is
  // buffered and stops reading.
  void stop();
  // For an owner going away: stops reading and lets go of the writer without
  // running on_eof (nothing of the owner may be called any more).
  void abandon();
  bool finished() const { return eof_; }

 private:
  void read_more();
  void consume(std::string_view data);
  void emit_line(std::string_view line, bool complete);
  void at_eof();
  void push(AsyncWriter::Sink sink, std::string_view bytes);

  boost::asio::posix::stream_descriptor pipe_;
  PumpTargets targets_;
  LineSplitter splitter_;
  std::array<char, 65536> buf_{};
  std::string line_buf_;
  bool eof_ = false;
  bool blocked_ = false;
  void set_blocked(bool blocked);
  std::function<void()> on_eof_;
};

using muster::write_fully;

}  // namespace muster::launcher
