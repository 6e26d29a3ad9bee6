// libFuzzer target: the real rendezvous and store servers, each session fed
// the input as a byte stream over loopback TCP. The first byte picks the
// port: the rendezvous's own, or one shared by a store and a rendezvous, as
// the static backend's --master-port is (launcher/multinode/shared_port.hpp). Both servers live across inputs, so state that one input
// leaves behind meets the next.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "muster/common/log.hpp"
#include "muster/rendezvous/server.hpp"
#include "muster/store/server.hpp"
#include "shared_port.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

struct Servers {
  asio::io_context io;
  std::unique_ptr<muster::rendezvous::RendezvousServer> rdzv;
  std::unique_ptr<muster::rendezvous::RendezvousServer> diverted;
  std::unique_ptr<muster::store::StoreServer> store;
  std::unique_ptr<muster::launcher::SharedPort> shared;
  Servers() {
    muster::log::set_level(muster::log::Level::error);
    rdzv = std::move(muster::rendezvous::RendezvousServer::listen(io, "127.0.0.1", 0)).value();
    store = muster::store::StoreServer::create(io);
    diverted = muster::rendezvous::RendezvousServer::create(io);
    shared = std::move(muster::launcher::SharedPort::listen(
                           io, "127.0.0.1", 0,
                           [this](tcp::socket s, std::string read) { store->adopt(std::move(s), std::move(read)); },
                           [this](tcp::socket s, std::string read) { diverted->adopt(std::move(s), std::move(read)); }))
                 .value();
  }
};

Servers& servers() {
  static Servers s;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  auto& s = servers();
  int port = (data[0] & 1) ? s.shared->port() : s.rdzv->port();
  tcp::socket client(s.io);
  boost::system::error_code ec;
  client.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)), ec);
  // A loopback connect fails only when this process runs out of ports or
  // descriptors: the harness's limit, not the server's fault.
  if (ec) return 0;
  // Closed with a reset, so the client side leaves no TIME_WAIT behind and a
  // long run does not use up the ephemeral ports.
  client.set_option(asio::socket_base::linger(true, 0), ec);
  bool done = false;
  std::array<char, 65536> buf{};
  asio::async_write(client, asio::buffer(data + 1, size - 1), [&](const boost::system::error_code&, std::size_t) {
    boost::system::error_code ignored;
    client.shutdown(tcp::socket::shutdown_send, ignored);
  });
  std::function<void()> drain = [&] {
    client.async_read_some(asio::buffer(buf), [&](const boost::system::error_code& e, std::size_t) {
      if (e) {
        done = true;
        return;
      }
      drain();
    });
  };
  drain();
  // The server answers and closes, or waits for more (a WAIT, a round); a
  // bounded wait either way, then the client goes.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
  while (!done && std::chrono::steady_clock::now() < deadline) s.io.run_one_for(std::chrono::milliseconds(1));
  client.close(ec);
  s.io.poll();
  return 0;
}
