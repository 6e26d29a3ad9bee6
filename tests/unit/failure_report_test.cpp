#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

#include "failure_report.hpp"

using namespace muster::launcher;

namespace {

std::string temp_file(const std::string& content) {
  char path[] = "/tmp/muster_error_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  ::write(fd, content.data(), content.size());
  ::close(fd);
  return path;
}

}  // namespace

TEST_CASE("a failure without error file reports torchrun's hint or the signal", "[report]") {
  auto exit3 = make_process_failure(1, 1, 4242, 3, "/nonexistent/error.json", 1000, false);
  CHECK(exit3.error_file == "<N/A>");
  CHECK(exit3.message == "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html");
  CHECK(exit3.timestamp == 1000);
  auto segv = make_process_failure(0, 0, 77, -11, "", 1000, false);
  CHECK(segv.message == "Signal 11 (SIGSEGV) received by PID 77");
}

TEST_CASE("an error file gives the traceback and the timestamp", "[report]") {
  std::string path = temp_file(
      R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback:\n  x\nValueError: boom\n", "timestamp": "1796224704"}}})");
  auto f = make_process_failure(1, 1, 10, 1, path, 5, false);
  CHECK(f.error_file == path);
  CHECK(f.message_is_object);
  CHECK(f.message == "Traceback:\n  x\nValueError: boom\n");
  CHECK(f.timestamp == 1796224704);
  std::string str_path = temp_file(R"({"message": "plain words", "timestamp": 12})");
  auto s = make_process_failure(0, 0, 10, 1, str_path, 5, false);
  CHECK_FALSE(s.message_is_object);
  CHECK(s.message == "plain words");
  CHECK(s.timestamp == 12);
  std::string bad = temp_file("{not json");
  auto b = make_process_failure(0, 0, 10, 1, bad, 5, false);
  CHECK(b.message.find("Failed to parse reply file: " + bad) == 0);
  unlink(path.c_str());
  unlink(str_path.c_str());
  unlink(bad.c_str());
}

TEST_CASE("the report has torchrun's layout with the root cause last", "[report]") {
  setenv("TZ", "UTC", 1);
  tzset();
  ProcessFailure root = make_process_failure(1, 1, 10422, 1, "", 1796224704, false);
  root.error_file = "/e/1/error.json";
  root.message = "Traceback (most recent call last):\nValueError: boom on rank1\n";
  root.message_is_object = true;
  ProcessFailure peer = make_process_failure(0, 0, 10421, -15, "", 1796224705, true);
  std::string text = format_failure_report("/tmp/w1.py", {root, peer}, "localhost");
  // The widest line is the peer's traceback, 55 characters.
  std::string expected =
      "\n"
      "=======================================================\n"
      "/tmp/w1.py FAILED\n"
      "-------------------------------------------------------\n"
      "Failures:\n"
      "[1]:\n"
      "  time      : 2026-12-02_15:18:25\n"
      "  host      : localhost\n"
      "  rank      : 0 (local_rank: 0)\n"
      "  exitcode  : -15 (pid: 10421)  (SIGTERM)\n"
      "  error_file: <N/A>\n"
      "  traceback : Signal 15 (SIGTERM) received by PID 10421\n"
      "-------------------------------------------------------\n"
      "Root Cause (first observed failure):\n"
      "[0]:\n"
      "  time      : 2026-12-02_15:18:24\n"
      "  host      : localhost\n"
      "  rank      : 1 (local_rank: 1)\n"
      "  exitcode  : 1 (pid: 10422) \n"
      "  error_file: /e/1/error.json\n"
      "  traceback : Traceback (most recent call last):\n"
      "  ValueError: boom on rank1\n"
      "  \n"
      "=======================================================";
  CHECK(text == expected);
}

TEST_CASE("the report is as wide as its widest line, at most 60", "[report]") {
  setenv("TZ", "UTC", 1);
  tzset();
  auto f = make_process_failure(1, 1, 10481, -11, "", 0, false);
  std::string text = format_failure_report("x.py", {f}, "localhost");
  // "  traceback : Signal 11 (SIGSEGV) received by PID 10481" is 55 wide, and
  // "  exitcode  : -11 (pid: 10481)  (SIGSEGV)" less.
  CHECK(text.find("\n" + std::string(55, '=') + "\n") == 0);
  CHECK(text.find("  exitcode  : -11 (pid: 10481)  (SIGSEGV)\n") != std::string::npos);
  CHECK(text.find("  <NO_OTHER_FAILURES>") != std::string::npos);
}

TEST_CASE("the root cause is the earliest failure, never a stopped peer", "[report]") {
  auto a = make_process_failure(0, 0, 1, -15, "", 100, true);
  auto b = make_process_failure(1, 1, 2, 1, "", 100, false);
  auto c = make_process_failure(2, 2, 3, 1, "", 99, false);
  CHECK(root_cause_index({a, b}) == 1);
  CHECK(root_cause_index({a, b, c}) == 2);
}
