// The remote side of a launch over ssh: an agent that a launching command
// (muster --hostfile) started reads that command's channel (its standard
// input at start, launch_channel.hpp) on the event loop. A stop order, the
// channel's end, or no heartbeat for the silence limit ends the job as a
// signal would: the launching command was stopped, killed, or cut off.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <array>
#include <chrono>
#include <functional>
#include <string>

#include "line_splitter.hpp"
#include "muster/net/unique_fd.hpp"

namespace muster::launcher {

class LauncherLink {
 public:
  // signo: the signal to end the job with; why: for the log.
  using Stop = std::function<void(int signo, const std::string& why)>;
  LauncherLink(boost::asio::io_context& io, net::UniqueFd channel, std::chrono::milliseconds silence, Stop on_stop);
  ~LauncherLink();
  LauncherLink(const LauncherLink&) = delete;
  LauncherLink& operator=(const LauncherLink&) = delete;

  void start();
  // No more orders (the job is over).
  void close();

 private:
  void read();
  void arm();
  void stop(int signo, const std::string& why);

  boost::asio::posix::stream_descriptor stream_;
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds silence_;
  std::chrono::steady_clock::time_point last_heard_;
  Stop on_stop_;
  LineSplitter lines_;
  std::array<char, 4096> buffer_{};
  bool stopped_ = false;
};

}  // namespace muster::launcher
