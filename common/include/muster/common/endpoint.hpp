// host[:port] and [v6]:port, the way torchrun's rendezvous utilities read them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "muster/common/status.hpp"

namespace muster {

struct Endpoint {
  std::string host;  // without IPv6 brackets
  int port = -1;     // -1: none given and no default

  // host:port with brackets around an IPv6 host.
  std::string to_string() const;
};

// Empty text gives localhost:default_port. A port must be 0..65535.
Result<Endpoint> parse_endpoint(std::string_view text, int default_port);

}  // namespace muster
