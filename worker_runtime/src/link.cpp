#include "link.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "muster/process_group.hpp"

namespace muster::detail {

TcpLink::TcpLink(std::vector<int> members, int position, net::UniqueFd next, net::UniqueFd prev)
    : members_(std::move(members)), position_(position), next_(std::move(next)), prev_(std::move(prev)) {}

void TcpLink::shut() {
  if (next_) ::shutdown(next_.get(), SHUT_RDWR);
  if (prev_) ::shutdown(prev_.get(), SHUT_RDWR);
}

void TcpLink::peer_failed(bool sending, const std::string& why, const char* what) const {
  const int n = static_cast<int>(members_.size());
  int peer = members_[static_cast<std::size_t>(((position_ + (sending ? 1 : -1)) % n + n) % n)];
  throw Error("the connection to rank " + std::to_string(peer) + " broke during " + what + " (" + why +
              "): that rank exited or failed");
}

void TcpLink::exchange(const char* send, std::size_t send_len, char* recv, std::size_t recv_len,
                       const std::function<void(std::size_t)>& on_recv, Clock::time_point deadline,
                       const char* what) {
  std::size_t sent = 0, got = 0;
  while (sent < send_len || got < recv_len) {
    // Try without waiting first: most calls find the socket ready.
    bool progressed = false;
    if (sent < send_len) {
      ssize_t n = ::send(next_.get(), send + sent, send_len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
        progressed = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        peer_failed(true, std::strerror(errno), what);
      }
    }
    if (got < recv_len) {
      ssize_t n = ::recv(prev_.get(), recv + got, recv_len - got, MSG_DONTWAIT);
      if (n > 0) {
        got += static_cast<std::size_t>(n);
        if (on_recv) on_recv(got);
        progressed = true;
      } else if (n == 0) {
        peer_failed(false, "end of stream", what);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        peer_failed(false, std::strerror(errno), what);
      }
    }
    if (progressed) continue;
    auto now = Clock::now();
    if (now >= deadline) throw TimeoutError(std::string("waiting for the ring's peers during ") + what);
    pollfd fds[2];
    int nfds = 0;
    if (sent < send_len) fds[nfds++] = {next_.get(), POLLOUT, 0};
    if (got < recv_len) fds[nfds++] = {prev_.get(), POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    int rc = ::poll(fds, static_cast<nfds_t>(nfds), static_cast<int>(std::max<long long>(1, left)));
    if (rc < 0 && errno != EINTR) throw Error(std::string("poll failed during ") + what + ": " + std::strerror(errno));
  }
}

}  // namespace muster::detail
