// Cuts a byte stream into lines. Bytes without a newline are buffered up to
// max_line and then handed on as a piece, so one runaway writer cannot grow
// the buffer without bound; a line that arrives whole is handed on whole.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace muster::launcher {

class LineSplitter {
 public:
  // line excludes the '\n'; complete is false for a piece of an over-long line
  // and for the unterminated tail handed on by finish().
  using Sink = std::function<void(std::string_view line, bool complete)>;

  explicit LineSplitter(std::size_t max_line = 64 * 1024) : max_line_(max_line) {}

  void feed(std::string_view data, const Sink& sink);
  // Hands on what is left without a newline, if anything.
  void finish(const Sink& sink);
  std::size_t buffered() const { return pending_.size(); }

 private:
  std::size_t max_line_;
  std::string pending_;
};

}  // namespace muster::launcher
