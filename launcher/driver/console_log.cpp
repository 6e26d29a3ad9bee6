#include "console_log.hpp"

#include <string>

#include "muster/common/log.hpp"

namespace muster::launcher {

ConsoleLog::ConsoleLog(AsyncWriter& writer, AsyncWriter::Sink stderr_sink) : writer_(writer), sink_(stderr_sink) {
  log::set_writer([this](std::string_view line) { log_line(line); });
}

ConsoleLog::~ConsoleLog() { log::set_writer(nullptr); }

void ConsoleLog::say(std::string_view text) {
  if (writer_.finished()) {
    writer_.write_after_finish(sink_, text);
  } else if (ending_) {
    writer_.push_final(sink_, text);
  } else {
    writer_.push(sink_, text);
  }
}

void ConsoleLog::log_line(std::string_view line) {
  if (writer_.finished()) {
    writer_.write_after_finish(sink_, line);
    return;
  }
  if (writer_.full(sink_)) {
    ++dropped_;
    ++dropped_total_;
    return;
  }
  if (dropped_ > 0) {
    writer_.push(sink_, "muster: " + std::to_string(dropped_) + " log lines were dropped while stderr was not being read\n");
    dropped_ = 0;
  }
  writer_.push(sink_, line);
}

}  // namespace muster::launcher
