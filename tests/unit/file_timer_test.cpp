#include <catch2/catch.hpp>

#include <csignal>

#include "file_timer.hpp"

using namespace muster::launcher;

TEST_CASE("timer requests are read as torch's FileTimerClient writes them", "[file_timer]") {
  auto r = parse_timer_request(
      R"({"version": 1, "pid": 4242, "scope_id": "step", "expiration_time": 1700000000.25, "signal": 9})");
  REQUIRE(r.ok());
  CHECK(r->pid == 4242);
  CHECK(r->scope_id == "step");
  CHECK(r->expiration_time == 1700000000.25);
  CHECK(r->signal == SIGKILL);
  auto release = parse_timer_request(R"({"version": 1, "pid": 7, "scope_id": "s", "expiration_time": -1, "signal": 0})");
  REQUIRE(release.ok());
  CHECK(release->expiration_time < 0);
}

TEST_CASE("malformed timer requests are refused with what is wrong", "[file_timer]") {
  auto why = [](const std::string& line) {
    auto r = parse_timer_request(line);
    REQUIRE_FALSE(r.ok());
    return r.status().message();
  };
  CHECK(why("not json") == "a timer request that is not a JSON object");
  CHECK(why("[1, 2]") == "a timer request that is not a JSON object");
  CHECK(why(R"({"scope_id": "s", "expiration_time": 1, "signal": 9})") == "a timer request without \"pid\"");
  CHECK(why(R"({"pid": "12", "scope_id": "s", "expiration_time": 1, "signal": 9})") == "\"pid\" is not an integer");
  CHECK(why(R"({"pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9})") == "\"pid\" is out of range");
  CHECK(why(R"({"pid": 99999999999, "scope_id": "s", "expiration_time": 1, "signal": 9})") ==
        "\"pid\" is out of range");
  CHECK(why(R"({"pid": 5, "scope_id": "s", "expiration_time": 1, "signal": 999})") == "\"signal\" is out of range");
  CHECK(why(R"({"pid": 5, "scope_id": 3, "expiration_time": 1, "signal": 9})") ==
        "\"scope_id\" is missing or not a string");
  CHECK(why(R"({"pid": 5, "scope_id": "s", "expiration_time": "soon", "signal": 9})") ==
        "\"expiration_time\" is missing or not a finite number");
  CHECK(why(std::string(5000, ' ')).find("5000 bytes") != std::string::npos);
}

TEST_CASE("the timer table expires, releases and reaps as torch's server does", "[file_timer]") {
  FileTimerTable t;
  CHECK(t.apply({10, "a", 100.0, SIGKILL}));
  CHECK(t.apply({10, "b", 90.0, 0}));
  CHECK(t.apply({11, "a", 200.0, SIGTERM}));
  CHECK(t.apply({12, "x", 95.0, 0}));
  CHECK(t.next_expiration() == 90.0);
  CHECK(t.take_expired(89.0).empty());

  // pid 10: both expired; the first with a signal (in expiration order) decides.
  auto expired = t.take_expired(150.0);
  REQUIRE(expired.size() == 2);
  CHECK(expired[0].pid == 10);
  CHECK(expired[0].signal == SIGKILL);
  CHECK(expired[0].scopes == std::vector<std::string>{"b", "a"});
  CHECK(expired[1].pid == 12);
  CHECK(expired[1].signal == 0);  // expires without a kill
  CHECK(t.size() == 1);

  // A release drops the timer; acquiring again replaces it.
  CHECK(t.apply({11, "a", -1, 0}));
  CHECK(t.size() == 0);
  CHECK(t.apply({11, "a", 300.0, SIGKILL}));
  CHECK(t.apply({11, "a", 400.0, SIGKILL}));
  CHECK(t.size() == 1);
  CHECK(t.take_expired(350.0).empty());
}

TEST_CASE("a reaped worker's other timers go with it, and the table is bounded", "[file_timer]") {
  FileTimerTable t;
  CHECK(t.apply({20, "now", 10.0, SIGKILL}));
  CHECK(t.apply({20, "later", 1000.0, SIGKILL}));
  auto expired = t.take_expired(20.0);
  REQUIRE(expired.size() == 1);
  CHECK(t.size() == 0);

  for (std::size_t i = 0; i < kMaxTimers; ++i) REQUIRE(t.apply({30, std::to_string(i), 1e9, SIGKILL}));
  CHECK_FALSE(t.apply({31, "one too many", 1e9, SIGKILL}));
  CHECK(t.apply({30, "0", -1, 0}));  // releases still work
  CHECK(t.apply({31, "now it fits", 1e9, SIGKILL}));

  // The scope names' bytes are bounded too.
  FileTimerTable big;
  std::string scope(4000, 's');
  std::size_t taken = 0;
  for (std::size_t i = 0; i < 3000; ++i) taken += big.apply({40, scope + std::to_string(i), 1e9, SIGKILL});
  CHECK(taken < 3000);
  CHECK(taken * 4004 <= kMaxTimerScopeBytes + 4004);
  big.forget(40);
  CHECK(big.size() == 0);
  CHECK(big.apply({41, scope, 1e9, SIGKILL}));  // forgetting gave the bytes back
}
