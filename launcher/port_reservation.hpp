// Holds a TCP port (bound and listening, all addresses) until the workers
// start, so the MASTER_PORT handed to them is free when worker 0 binds it.
#pragma once

#include <string>

#include "muster/common/status.hpp"

namespace muster::launcher {

class PortReservation {
 public:
  PortReservation() = default;
  ~PortReservation() { release(); }
  PortReservation(PortReservation&& o) noexcept : fd_(o.fd_), port_(o.port_) { o.fd_ = -1; }
  PortReservation& operator=(PortReservation&& o) noexcept;

  // port 0 picks a free one.
  static Result<PortReservation> acquire(int port);
  int port() const { return port_; }
  bool held() const { return fd_ >= 0; }
  void release();

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace muster::launcher
