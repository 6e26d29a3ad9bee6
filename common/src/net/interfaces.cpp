#include "muster/net/interfaces.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstring>

namespace muster::net {

std::vector<boost::asio::ip::address> interface_addresses() {
  std::vector<boost::asio::ip::address> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      out.push_back(boost::asio::ip::address_v4(ntohl(a->sin_addr.s_addr)));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      boost::asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &a->sin6_addr, b.size());
      out.push_back(boost::asio::ip::address_v6(b));
    }
  }
  freeifaddrs(list);
  return out;
}

}  // namespace muster::net
