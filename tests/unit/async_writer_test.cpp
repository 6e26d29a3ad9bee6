#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <string>

#include "async_writer.hpp"

using namespace muster::launcher;

TEST_CASE("a sink nobody reads fills up and has room again once read", "[async_writer]") {
  boost::asio::io_context io;
  auto busy = boost::asio::make_work_guard(io);  // as the agent's loop, never out of work
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  REQUIRE(fcntl(p[0], F_SETFL, O_NONBLOCK) == 0);  // the test's reads never block
  std::string errors;
  {
    AsyncWriter writer(io, [&](const std::string& name, int) { errors += name; }, 256 * 1024);
    writer.add(p[1], "pipe", true);
    std::string chunk(64 * 1024, 'x');
    for (int i = 0; i < 16 && !writer.full(p[1]); ++i) writer.push(p[1], chunk);
    CHECK(writer.full(p[1]));  // the pipe holds 64 KiB; the rest stays queued
    bool room = false;
    writer.when_room(p[1], [&] { room = true; });
    CHECK_FALSE(room);
    std::string sink(1 << 20, '\0');
    std::size_t got = 0;
    for (int i = 0; i < 400 && !room; ++i) {
      ssize_t n = ::read(p[0], sink.data(), sink.size());
      if (n > 0) got += static_cast<std::size_t>(n);
      io.run_for(std::chrono::milliseconds(5));
    }
    CHECK(room);
    CHECK(got > 0);
    writer.release(p[1]);
    // Read the rest so the writer drains and closes its end.
    for (int i = 0; i < 2000; ++i) {
      ssize_t n = ::read(p[0], sink.data(), sink.size());
      if (n == 0) break;  // the writer closed its end once everything was written
      if (n > 0) got += static_cast<std::size_t>(n);
      else usleep(5000);
    }
    CHECK(got % chunk.size() == 0);
  }
  CHECK(errors.empty());
  ::close(p[0]);
}

TEST_CASE("a sink whose writes fail is reported once and dropped", "[async_writer]") {
  boost::asio::io_context io;
  auto busy = boost::asio::make_work_guard(io);
  int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  int reports = 0;
  int error_number = 0;
  AsyncWriter writer(io, [&](const std::string&, int e) { ++reports, error_number = e; });
  writer.add(fd, "full", true);
  for (int i = 0; i < 100; ++i) writer.push(fd, "line\n");
  REQUIRE(writer.drain(std::chrono::seconds(5), std::chrono::seconds(10)));
  io.run_for(std::chrono::milliseconds(20));
  CHECK(reports == 1);
  CHECK(error_number == ENOSPC);
  CHECK_FALSE(writer.full(fd));
}
