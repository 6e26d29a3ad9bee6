#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <functional>
#include <future>
#include <thread>

#include "muster/store/client.hpp"
#include "muster/store/local_store.hpp"
#include "muster/store/server.hpp"

using namespace muster::store;
using namespace std::chrono_literals;

namespace {

// A server on its own io_context thread for the duration of a test.
struct ServerThread {
  boost::asio::io_context io;
  std::unique_ptr<StoreServer> server;
  std::thread thread;
  ServerThread() {
    auto s = StoreServer::listen(io, "127.0.0.1", 0);
    REQUIRE(s.ok());
    server = std::move(s.value());
    thread = std::thread([this] { io.run(); });
  }
  ~ServerThread() {
    boost::asio::post(io, [this] { server->close(); io.stop(); });
    thread.join();
  }
  int port() const { return server->port(); }
  // The waits the server holds, read on its own thread.
  std::size_t pending_waits() {
    std::promise<std::size_t> p;
    auto f = p.get_future();
    boost::asio::post(io, [&] { p.set_value(server->state().pending_waits()); });
    REQUIRE(f.wait_for(10s) == std::future_status::ready);  // the server's thread answers
    return f.get();
  }
};

StoreClient client(int port, ServerGeneration g, std::chrono::milliseconds timeout = 5000ms) {
  auto c = StoreClient::connect("127.0.0.1", port, {g, timeout});
  REQUIRE(c.ok());
  return std::move(c.value());
}

}  // namespace

TEST_CASE("clients of both dialects share one key space", "[server]") {
  ServerThread s;
  auto v2 = client(s.port(), ServerGeneration::torch_2_2);
  auto old = client(s.port(), ServerGeneration::torch_1_13);
  REQUIRE(v2.set("k", "from v2").ok());
  CHECK(old.get("k").value() == "from v2");
  CHECK(old.add("n", 3).value() == 3);
  CHECK(v2.add("n", 4).value() == 7);
  CHECK(v2.get("n").value() == "7");
  CHECK(v2.compare_set("k", "from v2", "swapped").value() == "swapped");
  CHECK(old.check({"k", "n"}).value());
  CHECK_FALSE(old.check({"k", "nope"}).value());
  CHECK(v2.num_keys().value() == 2);
  CHECK(v2.delete_key("k").value());
  CHECK_FALSE(v2.delete_key("k").value());
  REQUIRE(v2.multi_set({"a", "b"}, {"1", "2"}).ok());
  REQUIRE(v2.append("a", "+").ok());
  CHECK(v2.multi_get({"a", "b"}).value() == std::vector<std::string>{"1+", "2"});
  // Without VALIDATE, the server also takes the queries torch 2.0 and 2.1 added.
  auto mid = client(s.port(), ServerGeneration::torch_2_0);
  REQUIRE(mid.append("a", "!").ok());
  CHECK(mid.multi_get({"a", "b"}).value() == std::vector<std::string>{"1+!", "2"});
  // A 1.13 client sends no APPEND, and emulates MULTI_SET and MULTI_GET.
  CHECK(old.append("a", "x").code() == muster::Code::invalid_argument);
  REQUIRE(old.multi_set({"c", "d"}, {"3", "4"}).ok());
  CHECK(old.multi_get({"a", "c", "d"}).value() == std::vector<std::string>{"1+!", "3", "4"});
}

TEST_CASE("a wait is answered when another client sets the key", "[server]") {
  ServerThread s;
  auto waiter = client(s.port(), ServerGeneration::torch_2_2);
  auto setter = client(s.port(), ServerGeneration::torch_1_13);
  auto done = std::async(std::launch::async, [&] { return waiter.get("late"); });
  // The set comes only once the server holds the get's wait (bounded: 10 s).
  bool waiting = false;
  for (int i = 0; i < 1000 && !waiting; ++i) {
    waiting = s.pending_waits() == 1;
    if (!waiting) std::this_thread::sleep_for(10ms);
  }
  REQUIRE(waiting);
  REQUIRE(setter.set("late", "here").ok());
  auto got = done.get();
  REQUIRE(got.ok());
  CHECK(got.value() == "here");
}

TEST_CASE("a wait times out, is cancelled, and the connection goes on working", "[server]") {
  ServerThread s;
  auto c = client(s.port(), ServerGeneration::torch_2_2);
  auto st = c.wait({"never"}, 100ms);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == muster::Code::timeout);
  CHECK(st.message().find("'never'") != std::string::npos);
  REQUIRE(c.set("after", "ok").ok());
  CHECK(c.get("after").value() == "ok");
}

TEST_CASE("a malformed connection is closed and the others carry on", "[server]") {
  ServerThread s;
  auto good = client(s.port(), ServerGeneration::torch_2_2);
  REQUIRE(good.set("k", "v").ok());
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(s.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const unsigned char junk[] = {0x00, 0xce, 0xf7, 0x85, 0x3c, 0x7f};  // VALIDATE, then an unknown query
  REQUIRE(::send(fd, junk, sizeof junk, 0) == static_cast<ssize_t>(sizeof junk));
  char b = 0;
  CHECK(::recv(fd, &b, 1, 0) == 0);  // closed by the server
  ::close(fd);
  CHECK(good.get("k").value() == "v");
}

TEST_CASE("a client that finds no server says where it looked", "[server]") {
  int port = 0;
  {
    ServerThread s;
    port = s.port();
  }
  auto c = StoreClient::connect("127.0.0.1", port, {ServerGeneration::torch_2_2, 300ms});
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == muster::Code::unavailable);
  CHECK(c.status().message().find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
}

TEST_CASE("reset forgets the keys of the previous attempt", "[server]") {
  ServerThread s;
  {
    auto c = client(s.port(), ServerGeneration::torch_2_2);
    REQUIRE(c.set("old", "1").ok());
    REQUIRE(c.num_keys().value() == 1);
  }
  std::promise<void> reset;
  boost::asio::post(s.io, [&] { s.server->reset(); reset.set_value(); });
  reset.get_future().wait();
  auto c = client(s.port(), ServerGeneration::torch_2_2);
  CHECK(c.num_keys().value() == 0);
}

namespace {

// What every Store does, whoever serves it. a and b are two users of one store.
void check_contract(Store& a, Store& b, const std::function<std::size_t()>& pending_waits) {
  REQUIRE(a.set("k", "v").ok());
  CHECK(b.get("k").value() == "v");
  CHECK(a.add("n", 3).value() == 3);
  CHECK(b.add("n", -5).value() == -2);
  CHECK(a.get("n").value() == "-2");
  // compare_set: swapped; not swapped (the current value comes back);
  // missing key with an empty expectation: set.
  CHECK(a.compare_set("k", "v", "w").value() == "w");
  CHECK(b.compare_set("k", "x", "y").value() == "w");
  CHECK(a.compare_set("fresh", "", "made").value() == "made");
  CHECK(b.check({"k", "n"}).value());
  CHECK_FALSE(b.check({"k", "absent"}).value());
  CHECK(a.num_keys().value() == 3);
  CHECK(a.delete_key("fresh").value());
  CHECK_FALSE(b.delete_key("fresh").value());
  // Requests of one user are in order; of two, only once an answer came back:
  // each write is followed by a read of the same user's.
  REQUIRE(a.multi_set({"x", "y"}, {"1", "2"}).ok());
  CHECK(a.get("y").value() == "2");
  REQUIRE(b.append("x", "+").ok());
  CHECK(b.get("x").value() == "1+");
  CHECK(a.multi_get({"x", "y"}).value() == std::vector<std::string>{"1+", "2"});
  // A wait that nobody answers times out; one that another user answers ends.
  auto st = a.wait({"never"}, 100ms);
  CHECK(st.code() == muster::Code::timeout);
  std::promise<muster::Status> waited;
  std::thread waiter([&] { waited.set_value(a.wait({"later"}, 20s)); });
  auto until = std::chrono::steady_clock::now() + 20s;
  while (pending_waits() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(pending_waits() == 1);
  REQUIRE(b.set("later", "now").ok());
  auto result = waited.get_future();
  REQUIRE(result.wait_for(20s) == std::future_status::ready);
  CHECK(result.get().ok());
  waiter.join();
  CHECK(pending_waits() == 0);
  CHECK(b.get("later").value() == "now");
  // ADD on a value that is no number is refused (a server closes that connection).
  CHECK(a.add("k", 1).status().code() != muster::Code::ok);
}

}  // namespace

TEST_CASE("the Store contract: muster's server through two clients", "[server]") {
  ServerThread s;
  auto a = client(s.port(), ServerGeneration::torch_2_2);
  auto b = client(s.port(), ServerGeneration::torch_2_2);
  check_contract(a, b, [&] { return s.pending_waits(); });
}

TEST_CASE("the Store contract: a LocalStore shared by threads", "[server]") {
  LocalStore store;
  check_contract(store, store, [&] { return store.pending_waits(); });
}
