#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "muster/net/socket.hpp"
#include "muster/store/client.hpp"
#include "muster/store/protocol.hpp"
#include "muster/store/server.hpp"
#include "shared_port.hpp"

using namespace muster;
using namespace muster::launcher;
using namespace std::chrono_literals;
using namespace std::string_literals;

TEST_CASE("a shared port tells a rendezvous frame from a store request by the first bytes", "[shared_port]") {
  using V = SharedPort::Verdict;
  CHECK(SharedPort::classify("") == V::need_more);
  CHECK(SharedPort::classify("\0\0\0"s) == V::need_more);       // a frame's length, or a 2.x VALIDATE: wait
  CHECK(SharedPort::classify("\x05"s) == V::store);             // a 1.13 query that is not SET
  CHECK(SharedPort::classify("\0\0\0\x20{"s) == V::rendezvous);
  CHECK(SharedPort::classify("\0\x10\0\0{"s) == V::rendezvous);  // the largest frame there is
  CHECK(SharedPort::classify("\0\x10\0\x01{"s) == V::store);     // one byte more: no frame
  CHECK(SharedPort::classify("\0\0\0\0{"s) == V::store);         // an empty frame is none either
  std::string validate(5, '\0');  // a 2.x client's first request: VALIDATE, then its magic as the client's memory holds it
  std::memcpy(validate.data() + 1, &store::kValidateMagic, 4);
  CHECK(SharedPort::classify(validate) == V::store);
  CHECK(SharedPort::classify("\0\0\0\0\0\0\0\0\x01"s) == V::store);  // a 1.13 SET: 0, then an 8-byte length
}

TEST_CASE("a shared port hands store clients to the store and frames to the rendezvous", "[shared_port]") {
  boost::asio::io_context io;
  auto store = store::StoreServer::create(io);
  std::promise<std::string> frame_bytes;
  bool handed = false;
  auto shared = SharedPort::listen(
      io, "127.0.0.1", 0,
      [&](boost::asio::ip::tcp::socket s, std::string read) { store->adopt(std::move(s), std::move(read)); },
      [&](boost::asio::ip::tcp::socket s, std::string read) {
        handed = true;
        frame_bytes.set_value(read);
        boost::system::error_code ignored;
        s.close(ignored);
      });
  REQUIRE(shared.ok());
  int port = shared.value()->port();
  std::thread thread([&] { io.run_for(60s); });

  // A torch 2.x client and a 1.13 client reach the store and share its keys.
  auto now = store::StoreClient::connect("127.0.0.1", port, {store::ServerGeneration::torch_2_2, 10000ms});
  REQUIRE(now.ok());
  auto old = store::StoreClient::connect("127.0.0.1", port, {store::ServerGeneration::torch_1_13, 10000ms});
  REQUIRE(old.ok());
  REQUIRE(now.value().set("k", "v").ok());
  auto got = old.value().get("k");
  REQUIRE(got.ok());
  CHECK(got.value() == "v");

  // A frame, sent a byte at a time, goes to the rendezvous with every byte read so far.
  std::string frame = "\0\0\0\x0b{\"type\":1}"s;
  auto deadline = net::Clock::now() + 30s;
  auto fd = net::connect_tcp("127.0.0.1", port, deadline);
  REQUIRE(fd.ok());
  for (char c : frame.substr(0, 5)) {
    REQUIRE(net::send_all(fd.value().get(), &c, 1, deadline, "the shared port").ok());
    std::this_thread::sleep_for(5ms);
  }
  auto future = frame_bytes.get_future();
  REQUIRE(future.wait_for(30s) == std::future_status::ready);
  std::string read = future.get();
  CHECK(read.size() >= 5);
  CHECK(frame.compare(0, read.size(), read) == 0);

  boost::asio::post(io, [&] {
    shared.value()->close();
    store->close();
    io.stop();
  });
  thread.join();
  CHECK(handed);
}

TEST_CASE("one address cannot hold more than its share of undecided connections", "[shared_port]") {
  boost::asio::io_context io;
  auto shared = SharedPort::listen(
      io, "127.0.0.1", 0, [](boost::asio::ip::tcp::socket, std::string) {},
      [](boost::asio::ip::tcp::socket, std::string) {});
  REQUIRE(shared.ok());
  int port = shared.value()->port();
  std::thread thread([&] { io.run_for(120s); });
  auto undecided = [&] {
    std::promise<std::size_t> p;
    auto f = p.get_future();
    boost::asio::post(io, [&] { p.set_value(shared.value()->undecided()); });
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    return f.get();
  };
  // Waits (bounded) until the server holds n undecided connections.
  auto wait_until_held = [&](std::size_t n) {
    auto until = std::chrono::steady_clock::now() + 60s;
    while (undecided() != n && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    return undecided();
  };
  auto deadline = net::Clock::now() + 60s;
  std::vector<net::UniqueFd> quiet;
  for (std::size_t i = 0; i < SharedPort::kMaxUndecidedPerPeer; ++i) {
    auto fd = net::connect_tcp("127.0.0.1", port, deadline);
    REQUIRE(fd.ok());
    quiet.push_back(std::move(fd.value()));
  }
  REQUIRE(wait_until_held(SharedPort::kMaxUndecidedPerPeer) == SharedPort::kMaxUndecidedPerPeer);
  // One more from the same address is closed at once: it reads end of stream.
  auto extra = net::connect_tcp("127.0.0.1", port, deadline);
  REQUIRE(extra.ok());
  char byte = 0;
  auto got = net::recv_all(extra.value().get(), &byte, 1, net::Clock::now() + 30s, "the shared port");
  CHECK(got.code() == muster::Code::closed);  // closed by the port, not left waiting
  CHECK(undecided() == SharedPort::kMaxUndecidedPerPeer);
  // One of the quiet ones goes: there is room again.
  quiet.pop_back();
  REQUIRE(wait_until_held(SharedPort::kMaxUndecidedPerPeer - 1) == SharedPort::kMaxUndecidedPerPeer - 1);
  auto again = net::connect_tcp("127.0.0.1", port, deadline);
  REQUIRE(again.ok());
  CHECK(wait_until_held(SharedPort::kMaxUndecidedPerPeer) == SharedPort::kMaxUndecidedPerPeer);

  boost::asio::post(io, [&] {
    shared.value()->close();
    io.stop();
  });
  thread.join();
}
