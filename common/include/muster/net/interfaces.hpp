// The addresses of this machine's network interfaces.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <vector>

namespace muster::net {

// Every interface's address (getifaddrs), IPv4 and IPv6; empty when they
// cannot be listed.
std::vector<boost::asio::ip::address> interface_addresses();

}  // namespace muster::net
