// Parts of the agent that had no unit test of their own: the port reservation
// (multinode/) and the signal source (driver/).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <csignal>
#include <optional>

#include "port_reservation.hpp"
#include "signal_source.hpp"

using namespace muster::launcher;

namespace {

// Whether an IPv4 socket can bind 0.0.0.0:port now (as worker 0's store would).
bool bindable(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

TEST_CASE("a reserved MASTER_PORT is held until released, then free for worker 0", "[parts]") {
  auto r = PortReservation::acquire(0);
  REQUIRE(r.ok());
  const int port = r->port();
  CHECK(port > 0);
  CHECK(r->held());
  CHECK_FALSE(bindable(port));
  // A second reservation of the same port is refused, naming it and what to do.
  auto twice = PortReservation::acquire(port);
  REQUIRE_FALSE(twice.ok());
  CHECK_THAT(twice.status().message(), Catch::Contains("cannot reserve TCP port " + std::to_string(port)) &&
                                           Catch::Contains("pick a free one with --master-port"));
  CHECK(twice.status().sys_errno() == EADDRINUSE);
  r->release();
  CHECK_FALSE(r->held());
  CHECK(bindable(port));
}

TEST_CASE("the signal source hands out a pending signal, or waits for the next", "[parts]") {
  // Blocked in this thread, as main() blocks the agent's signals; raise() sends
  // to this thread, so no other thread of the test binary can take it.
  sigset_t usr1;
  sigset_t old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  REQUIRE(pthread_sigmask(SIG_BLOCK, &usr1, &old) == 0);
  boost::asio::io_context io;
  {
    auto source = SignalSource::open(io, {SIGUSR1});
    REQUIRE(source.ok());
    CHECK_FALSE(source.value()->take_pending());
    REQUIRE(raise(SIGUSR1) == 0);
    CHECK(source.value()->take_pending() == SIGUSR1);
    CHECK_FALSE(source.value()->take_pending());  // handed out once

    std::optional<int> seen;
    source.value()->async_wait([&](int signo) { seen = signo; });
    io.run_for(std::chrono::milliseconds(50));
    CHECK_FALSE(seen);  // nothing yet: it waits
    REQUIRE(raise(SIGUSR1) == 0);
    io.restart();
    io.run_for(std::chrono::seconds(5));
    CHECK(seen == SIGUSR1);

    // A cancelled wait calls nothing, even when a signal comes after.
    std::optional<int> after_cancel;
    source.value()->async_wait([&](int signo) { after_cancel = signo; });
    source.value()->cancel();
    REQUIRE(raise(SIGUSR1) == 0);
    io.restart();
    io.run_for(std::chrono::milliseconds(200));
    CHECK_FALSE(after_cancel);
    CHECK(source.value()->take_pending() == SIGUSR1);  // still there to be asked for
  }
  REQUIRE(pthread_sigmask(SIG_SETMASK, &old, nullptr) == 0);
}
