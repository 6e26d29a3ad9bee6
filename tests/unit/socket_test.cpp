// The socket layer (muster/net): descriptors closed by their owner, and every
// call bounded by its deadline, failing with a code, the call, the peer and errno.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <thread>

#include "muster/net/socket.hpp"

using namespace muster;
using namespace std::chrono_literals;

namespace {

bool is_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

// A listener, a connection to it and the accepted end.
struct Pair {
  net::Listener listener;
  net::UniqueFd client;
  net::UniqueFd server;
};

Pair connected_pair() {
  Pair p;
  auto l = net::listen_tcp(0, 4, net::Family::ipv4);
  REQUIRE(l.ok());
  p.listener = std::move(l.value());
  auto c = net::connect_tcp("127.0.0.1", p.listener.port, net::Clock::now() + 5s, true);
  REQUIRE(c.ok());
  p.client = std::move(c.value());
  p.server.reset(::accept4(p.listener.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  REQUIRE(p.server.valid());
  return p;
}

}  // namespace

TEST_CASE("UniqueFd closes what it holds, once, and moves ownership", "[socket]") {
  int raw[2];
  REQUIRE(pipe2(raw, O_CLOEXEC) == 0);
  {
    net::UniqueFd a(raw[0]);
    net::UniqueFd b(raw[1]);
    net::UniqueFd moved(std::move(a));
    CHECK_FALSE(a.valid());
    CHECK(moved.get() == raw[0]);
    b = std::move(moved);  // b's pipe end is closed, b holds raw[0] now
    CHECK_FALSE(is_open(raw[1]));
    CHECK(is_open(raw[0]));
    int given = b.release();
    CHECK(given == raw[0]);
    CHECK_FALSE(b.valid());
    b.reset(given);
  }
  CHECK_FALSE(is_open(raw[0]));
}

TEST_CASE("listen_tcp picks a free port and connect_tcp reaches it, and bytes go both ways", "[socket]") {
  auto p = connected_pair();
  CHECK(p.listener.port > 0);
  CHECK(net::bound_port(p.listener.fd.get()) == p.listener.port);
  CHECK(net::local_address(p.client.get()) == "127.0.0.1");
  const std::string sent(3 << 20, 'x');  // more than the socket buffers hold
  std::thread writer([&] { CHECK(net::send_all(p.client.get(), sent.data(), sent.size(), net::Clock::now() + 10s, "t").ok()); });
  std::string got(sent.size(), '\0');
  CHECK(net::recv_all(p.server.get(), got.data(), got.size(), net::Clock::now() + 10s, "t").ok());
  writer.join();
  CHECK(got == sent);
}

TEST_CASE("a port in use is refused with bind's errno", "[socket]") {
  auto first = net::listen_tcp(0, 1, net::Family::ipv4);
  REQUIRE(first.ok());
  auto second = net::listen_tcp(first->port, 1, net::Family::ipv4);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().sys_errno() == EADDRINUSE);
  CHECK(second.status().message().find("bind") != std::string::npos);
}

TEST_CASE("connecting to a port nobody listens on fails at once, naming the peer", "[socket]") {
  int port = 0;
  {
    auto l = net::listen_tcp(0, 1, net::Family::ipv4);
    REQUIRE(l.ok());
    port = l->port;
  }  // closed: nothing listens there now
  auto c = net::connect_tcp("127.0.0.1", port, net::Clock::now() + 5s, true);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == Code::unavailable);
  CHECK(c.status().sys_errno() == ECONNREFUSED);
  CHECK(c.status().message().find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
}

TEST_CASE("a name that does not resolve, or a numeric host that is no address, is an error", "[socket]") {
  auto c = net::connect_tcp("not an address", 80, net::Clock::now() + 1s, true);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message().find("cannot resolve") != std::string::npos);
}

TEST_CASE("recv_all gives up at its deadline, and reports the peer closing", "[socket]") {
  auto p = connected_pair();
  char buf[4];
  auto start = net::Clock::now();
  auto st = net::recv_all(p.server.get(), buf, sizeof buf, start + 100ms, "peer X");
  CHECK(st.code() == Code::timeout);
  CHECK(net::Clock::now() - start >= 100ms);
  CHECK(st.message().find("peer X") != std::string::npos);
  REQUIRE(net::send_all(p.client.get(), "ab", 2, net::Clock::now() + 1s, "t").ok());
  p.client.reset();
  st = net::recv_all(p.server.get(), buf, sizeof buf, net::Clock::now() + 5s, "peer X");
  CHECK(st.code() == Code::closed);
  CHECK(st.message() == "peer X closed the connection");
}

TEST_CASE("send_all gives up at its deadline when the peer reads nothing", "[socket]") {
  auto p = connected_pair();
  const std::string big(64 << 20, 'y');
  auto st = net::send_all(p.client.get(), big.data(), big.size(), net::Clock::now() + 200ms, "slow peer");
  CHECK(st.code() == Code::timeout);
  CHECK(st.message().find("slow peer") != std::string::npos);
}

TEST_CASE("poll_timeout_ms and host_port", "[socket]") {
  CHECK(net::poll_timeout_ms(net::Clock::now() - 1s) == 0);
  CHECK(net::poll_timeout_ms(net::Clock::now() + 1h, 1000) == 1000);
  CHECK(net::host_port("::1", 80) == "[::1]:80");
  CHECK(net::host_port("10.0.0.1", 80) == "10.0.0.1:80");
}
