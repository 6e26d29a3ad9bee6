#include "exposure.hpp"

#include "muster/net/interfaces.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

namespace muster::launcher {

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

bool is_loopback_name(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}


bool is_own_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  auto own = net::interface_addresses();
  bool found = false;
  for (addrinfo* ai = res; ai && !found; ai = ai->ai_next) {
    boost::asio::ip::address a;
    if (ai->ai_family == AF_INET) {
      a = boost::asio::ip::address_v4(ntohl(reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr.s_addr));
    } else if (ai->ai_family == AF_INET6) {
      boost::asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, b.size());
      a = boost::asio::ip::address_v6(b);
    } else {
      continue;
    }
    // The interface's scope id is not compared, as before: the address alone.
    for (const auto& o : own) {
      if (o.is_v6() && a.is_v6() ? o.to_v6().to_bytes() == a.to_v6().to_bytes() : o == a) found = true;
    }
  }
  freeaddrinfo(res);
  return found;
}

namespace {
bool is_ip_literal(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}
}  // namespace

std::string listen_address_for(const std::string& reach) {
  if (!is_ip_literal(reach)) return "";
  // Every 127/8 address is this machine's, whether or not an interface lists it.
  if (reach.rfind("127.", 0) == 0 || reach == "::1" || is_own_address(reach)) return reach;
  return "";
}

bool beyond_loopback(const std::string& bind) { return bind.empty() || bind == "::" || bind == "0.0.0.0" || !is_loopback_name(bind); }

}  // namespace muster::launcher
