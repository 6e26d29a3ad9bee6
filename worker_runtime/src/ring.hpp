// A TCP ring: this rank sends to the next member and receives from the
// previous one, both at once (non-blocking sockets under poll), so a step's
// send and receive overlap and a received piece is reduced while the rest is
// still arriving. A peer that exits closes its sockets: the collective fails
// at once instead of waiting for the timeout.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "muster/net/unique_fd.hpp"
#include "muster/process_group.hpp"
#include "wait.hpp"

namespace muster::detail {

class TcpRing {
 public:
  // members: global ranks in ring order; position: this rank's index in it.
  // next_fd / prev_fd: connected sockets (the same peer when size is 2, but
  // two sockets). A failure elsewhere reaches a ring as its sockets closing.
  TcpRing(std::vector<int> members, int position, net::UniqueFd next, net::UniqueFd prev);
  TcpRing(const TcpRing&) = delete;
  TcpRing& operator=(const TcpRing&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  int position() const { return position_; }

  void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, int divisor, Clock::time_point deadline);
  // out holds size() blocks of bytes; this rank's block must already be in place.
  void all_gather_in_place(void* out, std::size_t bytes, Clock::time_point deadline);
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, int divisor,
                      Clock::time_point deadline);
  // root: a ring position.
  void broadcast(void* data, std::size_t bytes, int root, Clock::time_point deadline);
  void barrier(Clock::time_point deadline);
  // Makes the peers' pending operations fail at once.
  void shut();

 private:
  // Sends send_len bytes to next while receiving recv_len bytes from prev;
  // on_recv(done_bytes) is called as received bytes accumulate.
  template <typename OnRecv>
  void exchange(const char* send, std::size_t send_len, char* recv, std::size_t recv_len, OnRecv&& on_recv,
                Clock::time_point deadline, const char* what);
  // One reduce step: sends send_count elements, and reduces the recv_count
  // elements arriving from prev into target.
  void send_and_reduce(const char* send, std::size_t send_count, char* target, std::size_t recv_count, DataType type,
                       ReduceOp op, Clock::time_point deadline, const char* what);
  std::pair<std::size_t, std::size_t> segment(std::size_t count, int k) const;
  int mod(int v) const { return ((v % size()) + size()) % size(); }
  [[noreturn]] void peer_failed(bool sending, const std::string& why, const char* what);

  std::vector<int> members_;
  int position_;
  net::UniqueFd next_;
  net::UniqueFd prev_;
  std::vector<char> scratch_;
};

}  // namespace muster::detail
