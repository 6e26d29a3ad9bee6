#include "port_reservation.hpp"

#include "muster/net/socket.hpp"

namespace muster::launcher {

Result<PortReservation> PortReservation::acquire(int port) {
  // Dual-stack [::] first, then 0.0.0.0, as PyTorch's store server binds.
  auto listener = net::listen_tcp(port, 1, net::Family::any);
  if (!listener.ok()) {
    return Status(Code::unavailable, "cannot reserve TCP port " + std::to_string(port) +
                                         " for MASTER_PORT: " + listener.status().message() +
                                         "; pick a free one with --master-port",
                  listener.status().sys_errno());
  }
  PortReservation r;
  r.fd_ = std::move(listener->fd);
  r.port_ = listener->port;
  return r;
}

}  // namespace muster::launcher
