// Blocking-style TCP on non-blocking sockets, every call bounded by a
// deadline: what the store client, the process group's rings and the port
// reservation share. (The event-loop side, on Asio, is asio_tcp.hpp.)
//
// Every failure is a Status whose code says what kind it is (timeout: the
// deadline passed; closed: the peer ended the stream; unavailable: nobody
// answered; io_error: anything else), whose message names the call and the
// peer, and whose sys_errno() is the call's errno.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "muster/common/status.hpp"
#include "muster/net/unique_fd.hpp"

namespace muster::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// poll()'s timeout until `deadline`: 0 once it has passed, at most cap_ms.
int poll_timeout_ms(Deadline deadline, int cap_ms = 1 << 30);

// "host:port", with brackets around an IPv6 address.
std::string host_port(std::string_view host, int port);

// The Status of a failed system call `call` on a socket to or from `peer`.
Status socket_error(Code code, std::string_view call, std::string_view peer, int err);

// Connects to host:port, trying each address it resolves to (numeric_host:
// an address, never looked up) until one answers or the deadline passes. The
// socket comes back non-blocking, close-on-exec, with TCP_NODELAY. One try
// per address: retrying a server that is not up yet is the caller's policy.
Result<UniqueFd> connect_tcp(const std::string& host, int port, Deadline deadline, bool numeric_host = false);

enum class Family {
  any,   // [::] dual-stack, or 0.0.0.0 where IPv6 is off
  ipv4,  // 0.0.0.0
  ipv6,  // [::] dual-stack
};
struct Listener {
  UniqueFd fd;
  int port = 0;
};
// Binds every address of this machine on `port` (0: a free one) and listens,
// with SO_REUSEADDR; close-on-exec, and non-blocking when asked.
Result<Listener> listen_tcp(int port, int backlog, Family family = Family::any, bool nonblocking = false);

// The port a socket is bound to; 0 if it cannot be read.
int bound_port(int fd);
// The numeric address of this end of a connected socket ("" if unknown); an
// IPv4 address reached through a dual-stack socket is given as IPv4.
std::string local_address(int fd);

// Sends all of [data, data+n) on a non-blocking socket before the deadline.
Status send_all(int fd, const void* data, std::size_t n, Deadline deadline, std::string_view peer);
// Receives exactly n bytes before the deadline; Code::closed when the peer
// ends the stream first.
Status recv_all(int fd, void* data, std::size_t n, Deadline deadline, std::string_view peer);

// TCP_NODELAY; and, when bytes > 0, SO_SNDBUF and SO_RCVBUF of that size.
void tune_socket(int fd, int buffer_bytes = 0);

}  // namespace muster::net
