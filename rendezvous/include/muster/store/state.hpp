// The key-value store behind the TCPStore protocol, without I/O: requests in,
// replies (bytes for a connection) out. One instance serves every connection
// of a server, whatever its dialect.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "muster/store/protocol.hpp"

namespace muster::store {

using ConnId = uint64_t;

struct Reply {
  ConnId conn = 0;
  std::string bytes;
};

class StoreState {
 public:
  // Carries out one request of `conn`. Replies (to conn, or to other
  // connections whose WAIT completed) are appended to out. Returns false when
  // the request is malformed for the store (e.g. ADD on a non-number): the
  // caller closes conn; error says why.
  bool handle(ConnId conn, Dialect dialect, const Request& req, std::vector<Reply>& out, std::string& error);

  // Drops the connection's pending WAITs and watches.
  void disconnect(ConnId conn);
  // Forgets every key, queue, waiter and watch.
  void clear();

  std::size_t num_keys() const { return data_.size(); }
  std::size_t pending_waits() const;
  bool contains(const std::string& key) const { return data_.count(key) > 0; }

 private:
  struct Waiter {
    ConnId conn = 0;
    std::size_t remaining = 0;
    std::vector<std::string> keys;
  };
  using WaiterPtr = std::shared_ptr<Waiter>;

  bool exists(const std::string& key) const;
  void changed(const std::string& key, std::vector<Reply>& out);
  void notify_watchers(const std::string& key, uint8_t kind, const std::string& old_value,
                       const std::string& new_value, std::vector<Reply>& out);
  void register_wait(ConnId conn, const std::vector<std::string>& missing);
  void forget_waiter(const WaiterPtr& w);
  void cancel_waits(ConnId conn);

  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, std::vector<WaiterPtr>> waiters_by_key_;
  std::unordered_map<ConnId, std::vector<WaiterPtr>> waiters_by_conn_;
  std::unordered_map<std::string, std::vector<ConnId>> watchers_;
};

}  // namespace muster::store
