#include "signal_source.hpp"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace muster::launcher {

Result<std::unique_ptr<SignalSource>> SignalSource::open(boost::asio::io_context& io, const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) return io_error(std::string("signalfd failed: ") + std::strerror(errno));
  return std::unique_ptr<SignalSource>(new SignalSource(io, fd));
}

SignalSource::SignalSource(boost::asio::io_context& io, int fd) : fd_(io, fd) {}

SignalSource::~SignalSource() { *alive_ = false; }

std::optional<int> SignalSource::take_pending() {
  if (!fd_.is_open()) return std::nullopt;
  signalfd_siginfo info{};
  ssize_t n = ::read(fd_.native_handle(), &info, sizeof info);
  if (n != static_cast<ssize_t>(sizeof info)) return std::nullopt;  // EAGAIN: nothing pending
  return static_cast<int>(info.ssi_signo);
}

void SignalSource::async_wait(std::function<void(int)> handler) {
  if (!fd_.is_open()) return;
  auto alive = alive_;
  fd_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                 [this, alive, handler = std::move(handler)](const boost::system::error_code& ec) mutable {
                   if (ec || !*alive) return;
                   if (auto signo = take_pending()) return handler(*signo);
                   // Taken by take_pending() meanwhile: wait for the next one.
                   async_wait(std::move(handler));
                 });
}

void SignalSource::cancel() {
  boost::system::error_code ignored;
  fd_.cancel(ignored);
}

}  // namespace muster::launcher
