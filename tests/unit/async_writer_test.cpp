#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "async_writer.hpp"
#include "muster/net/unique_fd.hpp"
#include "read_available.hpp"

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
    auto pipe = writer.add_owned(muster::net::UniqueFd(p[1]), "pipe");
    std::string chunk(64 * 1024, 'x');
    for (int i = 0; i < 16 && !writer.full(pipe); ++i) writer.push(pipe, chunk);
    CHECK(writer.full(pipe));  // the pipe holds 64 KiB; the rest stays queued
    bool room = false;
    writer.when_room(pipe, [&] { room = true; });
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
    writer.release(pipe);
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
  auto full = writer.add_owned(muster::net::UniqueFd(fd), "full");
  for (int i = 0; i < 100; ++i) writer.push(full, "line\n");
  REQUIRE(writer.drain(std::chrono::seconds(5), std::chrono::seconds(10)));
  io.run_for(std::chrono::milliseconds(20));
  CHECK(reports == 1);
  CHECK(error_number == ENOSPC);
  CHECK_FALSE(writer.full(full));
}

namespace {

// Whether a thread of this process is blocked in write(2) on fd now (the
// writer's thread on a full pipe), from /proc/self/task/*/syscall.
bool a_thread_writes_to(int fd) {
  char want[64];
  std::snprintf(want, sizeof want, "%d 0x%x ", static_cast<int>(SYS_write), static_cast<unsigned>(fd));
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(task.path() / "syscall");
    std::string line;
    if (std::getline(f, line) && line.rfind(want, 0) == 0) return true;
  }
  return false;
}

// Waits (bounded) until the writer's thread is held in its write on fd.
bool wait_writer_blocked_on(int fd) {
  for (int i = 0; i < 3000; ++i) {
    if (a_thread_writes_to(fd)) return true;
    usleep(10000);
  }
  return false;
}


}  // namespace

TEST_CASE("finish keeps to its limit past a sink nobody reads, and still writes the final messages elsewhere",
          "[async_writer]") {
  boost::asio::io_context io;
  auto busy = boost::asio::make_work_guard(io);
  int stuck[2];
  int report[2];
  REQUIRE(pipe2(stuck, O_CLOEXEC) == 0);
  REQUIRE(pipe2(report, O_CLOEXEC | O_NONBLOCK) == 0);
  AsyncWriter writer(io, nullptr, 256 * 1024);
  auto console = writer.add_borrowed(stuck[1], "the stuck console");
  auto err = writer.add_borrowed(report[1], "the report's console");
  std::string chunk(64 * 1024, 'x');
  // The pipe takes 64 KiB; the writer thread then blocks in write(2) on it.
  for (int i = 0; i < 3; ++i) writer.push(console, chunk);
  // Once the first chunk is in the pipe, the thread is blocked writing the second.
  REQUIRE(wait_writer_blocked_on(stuck[1]));
  REQUIRE(writer.queued(console) == 2 * chunk.size());
  // The thread is held on the console, so these wait in the report's queue.
  writer.push(err, "a line before the end\n");
  writer.push_final(err, "the final report\n");
  auto t0 = std::chrono::steady_clock::now();
  auto left = writer.finish(std::chrono::milliseconds(300));
  auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < std::chrono::seconds(5));  // bounded by its limit, not the 60 s of old
  REQUIRE(left.dropped.size() >= 1);
  std::map<std::string, std::size_t> dropped;
  for (const auto& d : left.dropped) dropped[d.name] = d.bytes;
  CHECK(dropped["the stuck console"] >= chunk.size());
  CHECK(dropped["the report's console"] == std::string("a line before the end\nthe final report\n").size());
  // The final message went straight to the console that takes bytes; the
  // ordinary line queued before it was dropped.
  CHECK(read_available(report[0]) == "the final report\n");
  CHECK(writer.finished());
  CHECK(writer.write_after_finish(err, "a note after the end\n"));
  CHECK(read_available(report[0]) == "a note after the end\n");
  CHECK_FALSE(writer.write_after_finish(console, "never\n"));  // the thread is stuck on it
  writer.push(err, "dropped: the writer has finished\n");
  CHECK(read_available(report[0]).empty());
  // Unblock the abandoned thread (its batch goes into the pipe and it
  // ends), so it is gone before the test's fds close.
  REQUIRE(fcntl(stuck[0], F_SETFL, O_NONBLOCK) == 0);
  std::size_t drained = 0;
  for (int i = 0; i < 200 && drained < 2 * chunk.size(); ++i) {
    drained += read_available(stuck[0]).size();
    usleep(10000);
  }
  CHECK(drained == 2 * chunk.size());  // the first chunk and the batch it was stuck on; the rest was dropped
  for (int fd : {stuck[0], stuck[1], report[0], report[1]}) ::close(fd);
}

TEST_CASE("finish writes everything while the sinks take it, and closes only owned descriptors",
          "[async_writer]") {
  boost::asio::io_context io;
  auto busy = boost::asio::make_work_guard(io);
  int borrowed[2];
  int owned[2];
  REQUIRE(pipe2(borrowed, O_CLOEXEC | O_NONBLOCK) == 0);
  REQUIRE(pipe2(owned, O_CLOEXEC | O_NONBLOCK) == 0);
  AsyncWriter writer(io, nullptr);
  auto b = writer.add_borrowed(borrowed[1], "borrowed");
  auto o = writer.add_owned(muster::net::UniqueFd(owned[1]), "owned");
  writer.push(b, "to the borrowed one\n");
  writer.push_final(o, "to the owned one\n");
  auto left = writer.finish(std::chrono::seconds(10));
  CHECK(left.dropped.empty());
  CHECK(read_available(borrowed[0]) == "to the borrowed one\n");
  CHECK(read_available(owned[0]) == "to the owned one\n");
  char c;
  CHECK(::read(owned[0], &c, 1) == 0);  // closed: end of file
  CHECK(fcntl(borrowed[1], F_GETFD) >= 0);  // still open
  for (int fd : {borrowed[0], borrowed[1], owned[0]}) ::close(fd);
}

TEST_CASE("finish gives up on a final message for a full console in blocking mode, within its bound",
          "[async_writer]") {
  // stdout and stderr are one pipe nobody reads (2>&1 into a stalled reader): the writer
  // thread is stuck on one, and the final report cannot go out on the other either.
  boost::asio::io_context io;
  auto busy = boost::asio::make_work_guard(io);
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  int err_fd = fcntl(p[1], F_DUPFD_CLOEXEC, 3);
  REQUIRE(err_fd >= 0);
  AsyncWriter writer(io, nullptr, 256 * 1024);
  auto out = writer.add_borrowed(p[1], "stdout");
  auto err = writer.add_borrowed(err_fd, "stderr");
  std::string chunk(64 * 1024, 'x');
  for (int i = 0; i < 3; ++i) writer.push(out, chunk);
  // The writer thread is held in its write on the full pipe before the report is queued.
  REQUIRE(wait_writer_blocked_on(p[1]));
  writer.push_final(err, "the final report\n");
  auto t0 = std::chrono::steady_clock::now();
  auto left = writer.finish(std::chrono::milliseconds(300));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK_FALSE(left.dropped.empty());
  CHECK_FALSE(writer.write_after_finish(err, "a note\n"));  // no room: given up, not blocked
  // Unblock the abandoned thread, so it ends before the fds close.
  REQUIRE(fcntl(p[0], F_SETFL, O_NONBLOCK) == 0);
  for (int i = 0; i < 200; ++i) {
    read_available(p[0]);
    usleep(10000);
  }
  for (int fd : {p[0], p[1], err_fd}) ::close(fd);
}
