// What the agent's listeners expose, and to whom (docs/security.md): which
// address a listener binds, and the warning for a rendezvous that anyone on
// the network can reach.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <string>
#include <vector>

namespace muster::launcher {

// "[::1]" -> "::1"; anything else as it is.
std::string strip_brackets(const std::string& host);

// "localhost", 127.x.y.z or ::1.
bool is_loopback_name(const std::string& host);
// Whether host resolves to an address of one of this machine's interfaces.
bool is_own_address(const std::string& host);

// Where to listen for connections that are made to `reach` (the address the
// workers or agents are given): that address itself when it is an IP literal
// of this machine (loopback included), so nothing listens on the other
// interfaces; "" (every interface) when it is a host name, which other hosts
// may resolve to another of this machine's addresses than this one does.
std::string listen_address_for(const std::string& reach);

// Whether a listener bound to `bind` ("" = every interface) can be reached
// from other machines.
bool beyond_loopback(const std::string& bind);

}  // namespace muster::launcher
