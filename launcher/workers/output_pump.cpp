#include "output_pump.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace muster::launcher {

OutputPump::OutputPump(boost::asio::io_context& io, int pipe_read_fd, PumpTargets targets)
    : pipe_(io, pipe_read_fd), targets_(std::move(targets)) {
  pipe_.non_blocking(true);
}

OutputPump::~OutputPump() {
  if (targets_.file && targets_.writer != nullptr) targets_.writer->release(targets_.file);
}

void OutputPump::start(std::function<void()> on_eof) {
  on_eof_ = std::move(on_eof);
  read_more();
}

void OutputPump::read_more() {
  if (eof_) return;
  auto self = shared_from_this();
  // A sink that is behind: read again once it has room.
  if (targets_.writer != nullptr) {
    for (AsyncWriter::Sink sink : {targets_.file, targets_.console, targets_.filtered}) {
      if (sink && targets_.writer->full(sink)) {
        set_blocked(true);
        targets_.writer->when_room(sink, [self] { self->read_more(); });
        return;
      }
    }
  }
  set_blocked(false);
  pipe_.async_read_some(boost::asio::buffer(buf_), [self](const boost::system::error_code& ec, std::size_t n) {
    if (self->eof_) return;  // stopped meanwhile
    if (n > 0) {
      self->consume(std::string_view(self->buf_.data(), n));
      if (self->targets_.on_activity) self->targets_.on_activity();
    }
    if (ec) {
      if (ec != boost::asio::error::operation_aborted) self->at_eof();
      return;
    }
    self->read_more();
  });
}

void OutputPump::set_blocked(bool blocked) {
  if (blocked == blocked_) return;
  blocked_ = blocked;
  if (targets_.on_blocked) targets_.on_blocked(blocked);
}

void OutputPump::stop() { at_eof(); }

void OutputPump::abandon() {
  on_eof_ = nullptr;
  targets_.on_activity = nullptr;
  targets_.on_blocked = nullptr;
  at_eof();
  targets_.writer = nullptr;
}

void OutputPump::push(AsyncWriter::Sink sink, std::string_view bytes) {
  if (sink && targets_.writer != nullptr) targets_.writer->push(sink, bytes);
}

void OutputPump::consume(std::string_view data) {
  push(targets_.file, data);
  if (targets_.raw_console) {
    push(targets_.console, data);
    return;
  }
  splitter_.feed(data, [this](std::string_view line, bool complete) { emit_line(line, complete); });
}

void OutputPump::emit_line(std::string_view line, bool /*complete*/) {
  line_buf_.clear();
  line_buf_ += targets_.prefix;
  line_buf_.append(line);
  line_buf_.push_back('\n');
  push(targets_.console, line_buf_);
  if (targets_.filtered) {
    for (const auto& f : targets_.filters) {
      if (line.find(f) != std::string_view::npos) {
        push(targets_.filtered, line_buf_);
        break;
      }
    }
  }
}

void OutputPump::at_eof() {
  if (eof_) return;
  eof_ = true;
  set_blocked(false);
  splitter_.finish([this](std::string_view line, bool complete) { emit_line(line, complete); });
  boost::system::error_code ignored;
  pipe_.cancel(ignored);
  if (targets_.file && targets_.writer != nullptr) {
    targets_.writer->release(targets_.file);
    targets_.file = {};
  }
  if (auto done = std::move(on_eof_)) {
    on_eof_ = nullptr;
    done();
  }
}

}  // namespace muster::launcher
