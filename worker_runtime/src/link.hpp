// A link: this rank's two connections in a ring, to the next member and from
// the previous one, and the one thing the ring's algorithms ask of them: send
// to next while receiving from prev, both at once (ring.hpp). The transport
// (TcpLink: sockets under poll) is written here; the algorithms are written
// against Link, as gloo writes its algorithms against a pair, so a test can
// run them over a link of its own.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "muster/net/unique_fd.hpp"
#include "wait.hpp"

namespace muster::detail {

class Link {
 public:
  virtual ~Link() = default;
  // The ring's members (global ranks, in ring order) and this rank's index.
  virtual const std::vector<int>& members() const = 0;
  virtual int position() const = 0;
  // Sends send_len bytes to next while receiving recv_len bytes from prev;
  // on_recv(received_so_far) runs as received bytes accumulate. Throws
  // TimeoutError past the deadline, Error when a peer goes away; `what`
  // names the collective in both.
  virtual void exchange(const char* send, std::size_t send_len, char* recv, std::size_t recv_len,
                        const std::function<void(std::size_t)>& on_recv, Clock::time_point deadline,
                        const char* what) = 0;
  // Makes the peers' pending operations fail at once.
  virtual void shut() = 0;
};

// The link over TCP: non-blocking sends and receives under poll, so a step's
// send and receive overlap. A peer that exits closes its sockets: the
// collective fails at once instead of waiting for the timeout.
class TcpLink final : public Link {
 public:
  // next / prev: connected sockets (the same peer when there are two
  // members, but two sockets).
  TcpLink(std::vector<int> members, int position, net::UniqueFd next, net::UniqueFd prev);

  const std::vector<int>& members() const override { return members_; }
  int position() const override { return position_; }
  void exchange(const char* send, std::size_t send_len, char* recv, std::size_t recv_len,
                const std::function<void(std::size_t)>& on_recv, Clock::time_point deadline,
                const char* what) override;
  void shut() override;

 private:
  [[noreturn]] void peer_failed(bool sending, const std::string& why, const char* what) const;

  std::vector<int> members_;
  int position_;
  net::UniqueFd next_;
  net::UniqueFd prev_;
};

}  // namespace muster::detail
