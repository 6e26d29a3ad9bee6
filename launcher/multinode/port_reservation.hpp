// Holds a TCP port (bound and listening, all addresses) until the workers
// start, so the MASTER_PORT handed to them is free when worker 0 binds it.
#pragma once

#include <string>

#include "muster/common/status.hpp"
#include "muster/net/unique_fd.hpp"

namespace muster::launcher {

class PortReservation {
 public:
  PortReservation() = default;

  // port 0 picks a free one.
  static Result<PortReservation> acquire(int port);
  int port() const { return port_; }
  bool held() const { return fd_.valid(); }
  void release() { fd_.reset(); }

 private:
  net::UniqueFd fd_;
  int port_ = 0;
};

}  // namespace muster::launcher
