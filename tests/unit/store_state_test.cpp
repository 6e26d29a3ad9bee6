#include <catch2/catch.hpp>

#include <cstring>

#include "muster/store/state.hpp"

using namespace muster::store;

namespace {

Request req(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {}, int64_t number = 0) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.number = number;
  return r;
}

struct Harness {
  StoreState state;
  std::vector<Reply> out;
  bool run(ConnId c, const Request& r) {
    std::string error;
    return state.handle(c, r, out, error);
  }
  std::vector<Reply> take() { return std::exchange(out, {}); }
};

std::string str(std::string_view s) {
  std::string out;
  put_string(out, s);
  return out;
}
std::string i64(int64_t v) {
  std::string out;
  put_i64(out, v);
  return out;
}

}  // namespace

TEST_CASE("a WAIT completes when its last missing key is set", "[store]") {
  Harness h;
  h.run(1, req(Op::wait, {"a", "b"}));
  CHECK(h.take().empty());
  h.run(2, req(Op::set, {"a"}, {"1"}));
  CHECK(h.take().empty());
  h.run(2, req(Op::set, {"a"}, {"2"}));  // the same key again does not count twice
  CHECK(h.take().empty());
  h.run(2, req(Op::add, {"b"}, {}, 5));
  auto replies = h.take();
  REQUIRE(replies.size() == 2);
  CHECK(replies[0].conn == 1);  // the waiter, woken by the ADD
  CHECK(replies[0].bytes == std::string(1, '\0'));
  CHECK(replies[1].conn == 2);  // then the ADD's own answer
  CHECK(h.state.pending_waits() == 0);
}

TEST_CASE("WAIT on present keys answers at once", "[store]") {
  Harness h;
  h.run(1, req(Op::set, {"k"}, {"v"}));
  h.run(1, req(Op::wait, {"k"}));
  auto r = h.take();
  REQUIRE(r.size() == 1);
  CHECK(r[0].bytes == std::string(1, '\0'));
  h.run(1, req(Op::wait, {}));
  CHECK(h.take().size() == 1);
}

TEST_CASE("COMPARE_SET answers as PyTorch's servers do", "[store]") {
  Harness h;
  h.run(1, req(Op::compare_set, {"k"}, {"", "new"}));
  CHECK(h.take()[0].bytes == str("new"));
  h.run(1, req(Op::compare_set, {"k"}, {"new", "v2"}));
  CHECK(h.take()[0].bytes == str("v2"));
  h.run(1, req(Op::compare_set, {"k"}, {"wrong", "v3"}));
  CHECK(h.take()[0].bytes == str("v2"));
  h.run(1, req(Op::compare_set, {"missing"}, {"x", "y"}));
  CHECK(h.take()[0].bytes == str("x"));
  CHECK_FALSE(h.state.contains("missing"));
}

TEST_CASE("ADD stores decimal text and refuses a non-number", "[store]") {
  Harness h;
  h.run(1, req(Op::add, {"c"}, {}, 2));
  CHECK(h.take()[0].bytes == i64(2));
  h.run(1, req(Op::add, {"c"}, {}, -5));
  CHECK(h.take()[0].bytes == i64(-3));
  h.run(1, req(Op::get, {"c"}));
  CHECK(h.take()[0].bytes == str("-3"));
  h.run(1, req(Op::set, {"t"}, {"  7abc"}));
  h.run(1, req(Op::add, {"t"}, {}, 1));
  CHECK(h.take()[0].bytes == i64(8));
  h.run(1, req(Op::set, {"s"}, {"text"}));
  CHECK_FALSE(h.run(1, req(Op::add, {"s"}, {}, 1)));
}

TEST_CASE("CHECK, GETNUMKEYS, DELETE_KEY, LIST_KEYS", "[store]") {
  Harness h;
  h.run(1, req(Op::set, {"a"}, {"1"}));
  h.run(1, req(Op::check, {"a", "b"}));
  CHECK(h.take()[0].bytes == std::string(1, '\1'));
  h.run(1, req(Op::set, {"b"}, {"1"}));
  h.run(1, req(Op::check, {"a", "b"}));
  CHECK(h.take()[0].bytes == std::string(1, '\0'));
  h.run(1, req(Op::num_keys));
  CHECK(h.take()[0].bytes == i64(2));
  h.run(1, req(Op::delete_key, {"a"}));
  CHECK(h.take()[0].bytes == i64(1));
  h.run(1, req(Op::delete_key, {"a"}));
  CHECK(h.take()[0].bytes == i64(0));
  h.run(1, req(Op::list_keys));
  CHECK(h.take()[0].bytes == i64(1) + str("b"));
}

TEST_CASE("MULTI_SET, MULTI_GET, APPEND", "[store]") {
  Harness h;
  h.run(1, req(Op::multi_set, {"x", "y"}, {"1", "2"}));
  h.run(1, req(Op::append, {"x"}, {"+"}));
  h.run(1, req(Op::multi_get, {"x", "y", "none"}));
  CHECK(h.take()[0].bytes == str("1+") + str("2") + str(""));
}

TEST_CASE("CANCEL_WAIT drops the connection's waits and always answers 01", "[store]") {
  Harness h;
  h.run(1, req(Op::wait, {"never"}));
  h.run(1, req(Op::cancel_wait));
  auto r = h.take();
  REQUIRE(r.size() == 1);
  CHECK(r[0].bytes == std::string(1, '\1'));
  h.run(2, req(Op::set, {"never"}, {"now"}));
  CHECK(h.take().empty());
  CHECK(h.state.pending_waits() == 0);
}

TEST_CASE("a disconnected client's waits are forgotten", "[store]") {
  Harness h;
  h.run(1, req(Op::wait, {"k"}));
  h.state.disconnect(1);
  h.run(2, req(Op::set, {"k"}, {"v"}));
  CHECK(h.take().empty());
}

TEST_CASE("a 1.13 wait that timed out on the client is still answered later", "[store]") {
  // 1.13 clients cannot cancel; the late 00 is what a 1.13 server sends too.
  Harness h;
  h.run(1, req(Op::wait, {"k"}));
  h.run(2, req(Op::set, {"k"}, {"v"}));
  auto r = h.take();
  REQUIRE(r.size() == 1);
  CHECK(r[0].conn == 1);
}

TEST_CASE("queues: push wakes one waiter, pop returns the length before", "[store]") {
  Harness h;
  h.run(1, req(Op::wait, {"q"}));
  h.run(2, req(Op::wait, {"q"}));
  h.run(3, req(Op::queue_push, {"q"}, {"item1"}));
  auto r = h.take();
  REQUIRE(r.size() == 1);
  CHECK(r[0].conn == 1);
  h.run(3, req(Op::queue_len, {"q"}));
  CHECK(h.take()[0].bytes == i64(1));
  h.run(3, req(Op::check, {"q"}));
  CHECK(h.take()[0].bytes == std::string(1, '\0'));
  h.run(3, req(Op::queue_pop, {"q"}));
  CHECK(h.take()[0].bytes == i64(1) + str("item1"));
  h.run(3, req(Op::queue_pop, {"q"}));
  CHECK(h.take()[0].bytes == i64(0));
}

TEST_CASE("BARRIER releases everyone when the count reaches the world size", "[store]") {
  Harness h;
  h.run(1, req(Op::barrier, {"b"}, {}, 3));
  h.run(2, req(Op::barrier, {"b"}, {}, 3));
  CHECK(h.take().empty());
  h.run(3, req(Op::barrier, {"b"}, {}, 3));
  auto r = h.take();
  CHECK(r.size() == 3);
  h.run(4, req(Op::barrier, {"b"}, {}, 3));  // reused: returns at once
  CHECK(h.take().size() == 1);
}

TEST_CASE("WATCH_KEY pushes created, updated and deleted", "[store]") {
  Harness h;
  h.run(9, req(Op::watch_key, {"w"}));
  CHECK(h.take()[0].bytes == std::string(1, '\3'));
  h.run(1, req(Op::set, {"w"}, {"a"}));
  auto created = h.take();
  REQUIRE(created.size() == 1);
  CHECK(created[0].conn == 9);
  CHECK(created[0].bytes == std::string(1, '\1') + str("w") + str("") + str("a"));
  h.run(1, req(Op::set, {"w"}, {"b"}));
  CHECK(h.take()[0].bytes == std::string(1, '\0') + str("w") + str("a") + str("b"));
  h.run(1, req(Op::delete_key, {"w"}));
  auto deleted = h.take();
  REQUIRE(deleted.size() == 2);
  CHECK(deleted[0].bytes == std::string(1, '\2') + str("w") + str("b") + str(""));
}

TEST_CASE("PING echoes and a bad VALIDATE is refused", "[store]") {
  Harness h;
  Request ping = req(Op::ping);
  ping.u32 = 0x12ab;
  h.run(1, ping);
  std::string echo;
  put_u32(echo, 0x12ab);
  CHECK(h.take()[0].bytes == echo);
  Request v = req(Op::validate);
  v.u32 = 1;
  CHECK_FALSE(h.run(1, v));
}

TEST_CASE("clear forgets keys and waiters", "[store]") {
  Harness h;
  h.run(1, req(Op::set, {"k"}, {"v"}));
  h.run(1, req(Op::wait, {"z"}));
  h.state.clear();
  CHECK(h.state.num_keys() == 0);
  CHECK(h.state.pending_waits() == 0);
}

TEST_CASE("a WAIT on many keys with repeats counts each key once and is answered once", "[store][hardening]") {
  Harness h;
  std::vector<std::string> keys;
  for (int i = 0; i < 50000; ++i) keys.push_back("k" + std::to_string(i % 25000));
  REQUIRE(h.run(1, req(Op::wait, keys)));
  CHECK(h.take().empty());
  CHECK(h.state.pending_waits() == 1);
  for (int i = 0; i < 24999; ++i) REQUIRE(h.run(2, req(Op::set, {"k" + std::to_string(i)}, {"v"})));
  CHECK(h.take().empty());
  REQUIRE(h.run(2, req(Op::set, {"k24999"}, {"v"})));
  auto out = h.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].conn == 1);
  CHECK(h.state.pending_waits() == 0);
}

TEST_CASE("cancelling one of several waits on a key leaves the others registered", "[store][hardening]") {
  Harness h;
  REQUIRE(h.run(1, req(Op::wait, {"a", "b"})));
  REQUIRE(h.run(2, req(Op::wait, {"a"})));
  REQUIRE(h.run(3, req(Op::wait, {"b", "a"})));
  h.state.disconnect(1);
  REQUIRE(h.run(4, req(Op::set, {"a"}, {"1"})));
  auto out = h.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].conn == 2);
  REQUIRE(h.run(4, req(Op::set, {"b"}, {"1"})));
  out = h.take();
  REQUIRE(out.size() == 1);
  CHECK(out[0].conn == 3);
  CHECK(h.state.pending_waits() == 0);
}

TEST_CASE("ADD and BARRIER wrap around instead of overflowing", "[store][hardening]") {
  Harness h;
  REQUIRE(h.run(1, req(Op::set, {"c"}, {"9223372036854775807"})));
  REQUIRE(h.run(1, req(Op::add, {"c"}, {}, 1)));
  CHECK(h.take().back().bytes == i64(INT64_MIN));
  REQUIRE(h.run(1, req(Op::add, {"c"}, {}, INT64_MIN)));
  CHECK(h.take().back().bytes == i64(0));
  REQUIRE(h.run(1, req(Op::set, {"b"}, {"9223372036854775807"})));
  REQUIRE(h.run(1, req(Op::barrier, {"b"}, {}, 2)));
  CHECK(h.state.pending_waits() == 1);  // INT64_MIN is below 2: the barrier waits
}

TEST_CASE("a connection's watches and waits are capped, and a watch is registered once", "[store][hardening]") {
  Harness h;
  REQUIRE(h.run(1, req(Op::watch_key, {"w"})));
  REQUIRE(h.run(1, req(Op::watch_key, {"w"})));
  h.take();
  REQUIRE(h.run(2, req(Op::set, {"w"}, {"v"})));
  CHECK(h.take().size() == 1);  // one notification, not one per WATCH_KEY
  for (std::size_t i = 1; i < kMaxWatchesPerConnection; ++i) {
    REQUIRE(h.run(1, req(Op::watch_key, {"w" + std::to_string(i)})));
  }
  CHECK_FALSE(h.run(1, req(Op::watch_key, {"one-too-many"})));

  std::vector<std::string> keys;
  for (std::size_t i = 0; i < kMaxKeyCount; ++i) keys.push_back("k" + std::to_string(i));
  REQUIRE(h.run(3, req(Op::wait, keys)));
  REQUIRE(h.run(3, req(Op::wait, keys)));
  CHECK_FALSE(h.run(3, req(Op::wait, {"one-more"})));
  h.state.disconnect(3);
  CHECK(h.state.pending_waits() == 0);
  REQUIRE(h.run(3, req(Op::wait, {"after"})));  // a new connection with that id starts afresh
}

TEST_CASE("a MULTI_GET whose reply would pass the limit is refused", "[store][hardening]") {
  Harness h;
  REQUIRE(h.run(1, req(Op::set, {"big"}, {std::string(64 * 1024 * 1024, 'x')})));
  std::vector<std::string> keys(9, "big");  // 576 MiB of reply
  std::string error;
  CHECK_FALSE(h.state.handle(1, req(Op::multi_get, keys), h.out, error));
  CHECK(error.find("over the limit") != std::string::npos);
  keys.resize(2);
  REQUIRE(h.run(1, req(Op::multi_get, keys)));
}
