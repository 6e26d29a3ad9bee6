// The server skeleton (muster/net/session_server.hpp): accepting, adopting,
// the sessions by id, and closing.
#include <catch2/catch.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <string>
#include <vector>

#include "muster/net/session_server.hpp"

using boost::asio::ip::tcp;

namespace {

struct FakeSession {
  explicit FakeSession(tcp::socket s) : socket(std::move(s)) {}
  void close() {
    ++closes;
    boost::system::error_code ignored;
    socket.close(ignored);
  }
  tcp::socket socket;
  std::string already_read;
  int closes = 0;
};

// Runs io until done() or a bound passes (every wait here ends on what it waits for).
template <typename Done>
bool run_until(boost::asio::io_context& io, Done done) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done() && std::chrono::steady_clock::now() < until) io.run_for(std::chrono::milliseconds(5));
  return done();
}

}  // namespace

TEST_CASE("session server: accepted and adopted connections become sessions, and close ends them all",
          "[session_server]") {
  boost::asio::io_context io;
  std::vector<std::shared_ptr<FakeSession>> made;
  std::unique_ptr<muster::net::SessionServer<FakeSession>> server;
  server = std::make_unique<muster::net::SessionServer<FakeSession>>(
      io, [&](tcp::socket socket, std::string already_read) {
        auto s = std::make_shared<FakeSession>(std::move(socket));
        s->already_read = std::move(already_read);
        made.push_back(s);
        server->add(server->next_id(), s);
      });
  auto port = server->listen("127.0.0.1", 0, "the test server", "test");
  REQUIRE(port.ok());
  CHECK(port.value() == server->port());
  CHECK(port.value() > 0);
  CHECK(server->open());

  tcp::socket a(io), b(io);
  a.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port.value())));
  REQUIRE(run_until(io, [&] { return server->size() == 1; }));
  // A connection accepted elsewhere, with the bytes already read from it.
  tcp::acceptor other(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  b.connect(other.local_endpoint());
  server->adopt(other.accept(), "abc");
  REQUIRE(server->size() == 2);
  CHECK(made[1]->already_read == "abc");
  CHECK(server->find(1) == made[0].get());
  CHECK(server->find(2) == made[1].get());
  CHECK(server->find(3) == nullptr);

  server->erase(1);
  CHECK(server->size() == 1);
  CHECK(made[0]->closes == 0);  // erasing is the server forgetting it, not closing it

  auto alive = server->alive();
  server->close();
  CHECK_FALSE(server->open());
  CHECK_FALSE(*alive);
  CHECK(server->size() == 0);
  CHECK(made[1]->closes == 1);
  server->close();  // idempotent
  CHECK(made[1]->closes == 1);

  // Closed: nothing more is accepted or adopted, and the port is given up.
  tcp::socket c(io);
  boost::system::error_code ec;
  c.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port.value())), ec);
  CHECK(ec);
  tcp::socket d(io);
  d.connect(other.local_endpoint());
  server->adopt(other.accept(), "");
  CHECK(made.size() == 2);
}

TEST_CASE("session server: close_sessions ends the sessions and goes on accepting", "[session_server]") {
  boost::asio::io_context io;
  std::vector<std::shared_ptr<FakeSession>> made;
  std::unique_ptr<muster::net::SessionServer<FakeSession>> server;
  server = std::make_unique<muster::net::SessionServer<FakeSession>>(io, [&](tcp::socket socket, std::string) {
    made.push_back(std::make_shared<FakeSession>(std::move(socket)));
    server->add(server->next_id(), made.back());
  });
  auto port = server->listen("127.0.0.1", 0, "the test server", "test");
  REQUIRE(port.ok());
  tcp::endpoint at(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port.value()));
  tcp::socket a(io);
  a.connect(at);
  REQUIRE(run_until(io, [&] { return server->size() == 1; }));
  server->close_sessions();
  CHECK(server->size() == 0);
  CHECK(made[0]->closes == 1);
  CHECK(server->open());
  tcp::socket b(io);
  b.connect(at);
  REQUIRE(run_until(io, [&] { return server->size() == 1; }));
  CHECK(server->find(2) == made[1].get());
}

TEST_CASE("acceptor: a port already listened on is refused with a message that names the server and the address",
          "[session_server]") {
  boost::asio::io_context io;
  muster::net::Acceptor first(io), second(io);
  auto port = first.listen("127.0.0.1", 0, "the first server", "first", [](tcp::socket) {});
  REQUIRE(port.ok());
  auto again = second.listen("127.0.0.1", port.value(), "the second server", "second", [](tcp::socket) {});
  REQUIRE_FALSE(again.ok());
  CHECK_THAT(again.status().message(), Catch::Contains("the second server cannot listen on 127.0.0.1:" +
                                                       std::to_string(port.value())));
  CHECK(second.open());  // never listened, never closed
  first.close();
  CHECK_FALSE(first.open());
  auto now = second.listen("127.0.0.1", port.value(), "the second server", "second", [](tcp::socket) {});
  CHECK(now.ok());
}
