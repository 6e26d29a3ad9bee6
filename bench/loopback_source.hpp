// What the benches need to open tens of thousands of loopback connections:
// each connection binds a source address of its own block of 127.0.0.0/8,
// kPerSourceAddress per address. One address has ~28,000 ephemeral ports and
// the kernel's search for a free one slows as they fill, so a few thousand per
// address keeps connects cheap; a block per run keeps a run away from the
// TIME_WAIT ports of the one before. IP_BIND_ADDRESS_NO_PORT leaves the port
// to connect(), which only needs it unique per destination.
#pragma once

#include <netinet/in.h>

#include <boost/asio/ip/tcp.hpp>

namespace bench {

constexpr unsigned kPerSourceAddress = 4000;

// Opens `socket` (IPv4) and binds it to connection i's source address in
// `block` (1..255); block 0 leaves the source to the kernel.
inline void bind_loopback_source(boost::asio::ip::tcp::socket& socket, unsigned block, unsigned i,
                                 boost::system::error_code& ec) {
  namespace ip = boost::asio::ip;
  socket.open(ip::tcp::v4(), ec);
  if (ec || block == 0) return;
  int one = 1;
  setsockopt(socket.native_handle(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  unsigned slot = i / kPerSourceAddress;
  ip::address_v4 from(ip::address_v4::bytes_type{127, static_cast<unsigned char>(block),
                                                 static_cast<unsigned char>(slot / 250),
                                                 static_cast<unsigned char>(1 + slot % 250)});
  socket.bind(ip::tcp::endpoint(from, 0), ec);
}

}  // namespace bench
