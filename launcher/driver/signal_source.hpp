// The agent's termination signals, read from a signalfd in the event loop.
// They stay blocked in every thread of the agent (main() blocks them before
// anything else starts), so none is lost and none interrupts a system call;
// a worker gets the default mask back before it runs (the shim).
//
// take_pending() lets the loop ask, before it handles a worker's exit,
// whether a signal came in first: a signal that Slurm or a user sent the
// agent and its workers together is then the root cause of the stop, never
// the worker that happened to be seen exiting first.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher {

class SignalSource {
 public:
  // The signals must already be blocked in the calling thread.
  static Result<std::unique_ptr<SignalSource>> open(boost::asio::io_context& io, const std::vector<int>& signals);
  ~SignalSource();
  SignalSource(const SignalSource&) = delete;
  SignalSource& operator=(const SignalSource&) = delete;

  // Calls handler(signo) for the next signal (once per call).
  void async_wait(std::function<void(int)> handler);
  // A signal that has arrived and not been handed out yet, without waiting.
  std::optional<int> take_pending();
  void cancel();

 private:
  explicit SignalSource(boost::asio::io_context& io, int fd);
  boost::asio::posix::stream_descriptor fd_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
