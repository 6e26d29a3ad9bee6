#include "launcher_link.hpp"

#include <csignal>
#include <variant>

#include "launch_channel.hpp"
#include "muster/common/log.hpp"
#include "signals.hpp"

namespace muster::launcher {

LauncherLink::LauncherLink(boost::asio::io_context& io, net::UniqueFd channel, std::chrono::milliseconds silence,
                           Stop on_stop)
    : stream_(io, channel.release()),
      timer_(io),
      silence_(silence),
      on_stop_(std::move(on_stop)),
      lines_(channel::kMaxRecordBytes) {}

LauncherLink::~LauncherLink() { close(); }

void LauncherLink::start() {
  last_heard_ = std::chrono::steady_clock::now();
  read();
  arm();
}

void LauncherLink::close() {
  stopped_ = true;
  boost::system::error_code ec;
  timer_.cancel();
  stream_.close(ec);
}

void LauncherLink::stop(int signo, const std::string& why) {
  if (stopped_) return;
  close();
  log::warning(why);
  on_stop_(signo, why);
}

void LauncherLink::read() {
  stream_.async_read_some(boost::asio::buffer(buffer_), [this](const boost::system::error_code& ec, std::size_t n) {
    if (stopped_ || ec == boost::asio::error::operation_aborted) return;
    if (ec) {
      stop(SIGTERM, "the launching command's channel closed (it ended, was killed, or its ssh connection "
                    "dropped): ending the job");
      return;
    }
    std::optional<std::pair<int, std::string>> order;
    lines_.feed(std::string_view(buffer_.data(), n), [&](std::string_view line, bool complete) {
      if (order) return;
      last_heard_ = std::chrono::steady_clock::now();
      auto rec = complete ? channel::decode_record(line)
                          : Result<channel::Record>(Status(Code::invalid_argument, "an over-long record"));
      if (!rec.ok()) {
        order = {SIGTERM, "the launching command's channel sent something unexpected (" + rec.status().message() +
                              "): ending the job"};
      } else if (auto* s = std::get_if<channel::record::Stop>(&rec.value())) {
        order = {s->signo, "the launching command asks to stop (" + signal_name(s->signo) + ")"};
      }
    });
    if (order) return stop(order->first, order->second);
    read();
  });
}

void LauncherLink::arm() {
  timer_.expires_after(std::chrono::milliseconds(500));
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    auto quiet = std::chrono::steady_clock::now() - last_heard_;
    if (quiet > silence_) {
      return stop(SIGTERM, "no word from the launching command for " +
                               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(quiet).count()) +
                               " s (its host or the network to it is down, or it is stopped): ending the job");
    }
    arm();
  });
}

}  // namespace muster::launcher
