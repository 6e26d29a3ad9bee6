#include <catch2/catch.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/write.hpp>
#include <string>

#include "muster/net/asio_tcp.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// A connected loopback pair on one io_context.
struct Pair {
  asio::io_context io;
  tcp::socket reader{io}, writer{io};
  Pair() {
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    writer.connect(acceptor.local_endpoint());
    acceptor.accept(reader);
  }
};

// Reads with a Reader until end of stream; returns everything read and the
// largest single read.
struct Drained {
  std::string bytes;
  std::size_t largest = 0;
  int reads = 0;
  bool ended = false;
};

asio::awaitable<void> drain(tcp::socket& socket, Drained& out) {
  muster::net::Reader reader;
  for (int i = 0; i < 100000; ++i) {  // bounded: far more reads than the test sends
    boost::system::error_code ec;
    auto view = co_await reader.read(socket, ec);
    if (ec) {
      out.ended = view.empty();
      co_return;
    }
    out.bytes.append(view);
    out.largest = std::max(out.largest, view.size());
    ++out.reads;
  }
}

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 13) % 26);
  return s;
}

}  // namespace

TEST_CASE("Reader returns every byte, small and large writes alike, then end of stream", "[tcp]") {
  Pair p;
  // Below, at, just above the inline buffer, and above the per-thread one.
  std::string sent;
  for (std::size_t n : {std::size_t{10}, muster::net::Reader::kInlineRead, muster::net::Reader::kInlineRead + 1,
                        std::size_t{200 * 1024}, std::size_t{3}}) {
    sent += pattern(n);
  }
  // Written while the reader reads: more than the socket buffers may hold.
  asio::async_write(p.writer, asio::buffer(sent), [&](const boost::system::error_code& ec, std::size_t) {
    REQUIRE_FALSE(ec);
    p.writer.shutdown(tcp::socket::shutdown_send);
  });
  Drained out;
  asio::co_spawn(p.io, drain(p.reader, out), asio::detached);
  p.io.run();
  CHECK(out.ended);
  CHECK(out.bytes.size() == sent.size());
  CHECK(out.bytes == sent);
  // A read that filled the inline buffer went on past it in one call.
  CHECK(out.largest > muster::net::Reader::kInlineRead);
}

TEST_CASE("Reader hands back a small request in one read", "[tcp]") {
  Pair p;
  std::string request = pattern(100);
  asio::write(p.writer, asio::buffer(request));
  std::string got;
  asio::co_spawn(
      p.io,
      [&]() -> asio::awaitable<void> {
        muster::net::Reader reader;
        boost::system::error_code ec;
        auto view = co_await reader.read(p.reader, ec);
        REQUIRE_FALSE(ec);
        got = std::string(view);
      },
      asio::detached);
  p.io.run();
  CHECK(got == request);
}
