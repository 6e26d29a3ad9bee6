#include "muster/net/socket.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace muster::net {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);
  fd_ = fd;
}

int poll_timeout_ms(Deadline deadline, int cap_ms) {
  // Rounded up: a wait never ends before its deadline.
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<long long>(left, cap_ms));
}

std::string host_port(std::string_view host, int port) {
  std::string h(host);
  if (h.find(':') != std::string::npos) h = "[" + h + "]";
  return h + ":" + std::to_string(port);
}

Status socket_error(Code code, std::string_view call, std::string_view peer, int err) {
  std::string message(call);
  if (!peer.empty()) message += " (" + std::string(peer) + ")";
  message += ": ";
  message += err == ETIMEDOUT && code == Code::timeout ? "timed out" : std::strerror(err);
  return Status(code, std::move(message), err);
}

namespace {

// Waits until fd is ready for `events` or the deadline passes; false on timeout.
bool wait_ready(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the next call report the error
  }
}

// One non-blocking connect to one address, bounded by the deadline.
Result<UniqueFd> connect_one(const addrinfo& ai, Deadline deadline, const std::string& peer) {
  UniqueFd fd(::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol));
  if (!fd) return socket_error(Code::io_error, "socket", peer, errno);
  if (::connect(fd.get(), ai.ai_addr, ai.ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) return socket_error(Code::unavailable, "connect", peer, errno);
  if (!wait_ready(fd.get(), POLLOUT, deadline)) return socket_error(Code::timeout, "connect", peer, ETIMEDOUT);
  int soerr = 0;
  socklen_t len = sizeof soerr;
  if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) soerr = errno;
  if (soerr != 0) return socket_error(Code::unavailable, "connect", peer, soerr);
  return fd;
}

}  // namespace

Result<UniqueFd> connect_tcp(const std::string& host, int port, Deadline deadline, bool numeric_host) {
  const std::string peer = host_port(host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (numeric_host) hints.ai_flags = AI_NUMERICHOST;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status(Code::unavailable, "cannot resolve " + host + ": " + (rc != 0 ? gai_strerror(rc) : "no address"));
  }
  Status last;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    auto fd = connect_one(*ai, deadline, peer);
    if (fd.ok()) {
      freeaddrinfo(res);
      tune_socket(fd->get());
      return fd;
    }
    last = fd.status();
    if (last.code() == Code::timeout) break;
  }
  freeaddrinfo(res);
  return last;
}

Result<Listener> listen_tcp(int port, int backlog, Family family, bool nonblocking) {
  const int flags = SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0);
  const std::string where = "port " + std::to_string(port);
  auto try_family = [&](int af) -> Result<Listener> {
    UniqueFd fd(::socket(af, flags, 0));
    if (!fd) return socket_error(Code::io_error, "socket", where, errno);
    int one = 1;
    int zero = 0;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (af == AF_INET6) {
      setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      return socket_error(Code::unavailable, "bind", where, errno);
    }
    if (::listen(fd.get(), backlog) != 0) return socket_error(Code::unavailable, "listen", where, errno);
    Listener l;
    l.port = bound_port(fd.get());
    l.fd = std::move(fd);
    return l;
  };
  if (family == Family::ipv4) return try_family(AF_INET);
  auto v6 = try_family(AF_INET6);
  if (v6.ok() || family == Family::ipv6) return v6;
  auto v4 = try_family(AF_INET);
  // Where both fail, the IPv4 error is the one that speaks of the port.
  return v4;
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return 0;
}

std::string local_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) {
    return "";
  }
  std::string h = host;
  if (h.rfind("::ffff:", 0) == 0 && h.find('.') != std::string::npos) h = h.substr(7);
  return h;
}

Status send_all(int fd, const void* data, std::size_t n, Deadline deadline, std::string_view peer) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return socket_error(Code::io_error, "send", peer, errno);
    if (!wait_ready(fd, POLLOUT, deadline)) return socket_error(Code::timeout, "send", peer, ETIMEDOUT);
  }
  return {};
}

Status recv_all(int fd, void* data, std::size_t n, Deadline deadline, std::string_view peer) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return Status(Code::closed, std::string(peer) + " closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return socket_error(Code::closed, "recv", peer, errno);
    if (!wait_ready(fd, POLLIN, deadline)) return socket_error(Code::timeout, "recv", peer, ETIMEDOUT);
  }
  return {};
}

void tune_socket(int fd, int buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
}

}  // namespace muster::net
