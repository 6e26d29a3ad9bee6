// The key-value store behind the TCPStore protocol, without I/O: requests in,
// replies (bytes for a connection) out. One instance serves every connection
// of a server, whatever its dialect.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
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
  // The dialect of conn does not matter here: the parser has already made
  // every request the same Request, and the replies are the same bytes.
  bool handle(ConnId conn, const Request& req, std::vector<Reply>& out, std::string& error);

  // Drops the connection's pending WAITs and watches.
  void disconnect(ConnId conn);
  // Forgets every key, queue, waiter and watch.
  void clear();

  std::size_t num_keys() const { return data_.size(); }
  std::size_t pending_waits() const;
  bool contains(const std::string& key) const { return data_.count(key) > 0; }

 private:
  // A WAIT (or BARRIER) of one connection on the keys still missing. It sits
  // in the list of each such key; every registration remembers where, so
  // satisfying or cancelling it costs O(its keys), whatever else waits.
  struct Waiter;
  using WaiterPtr = std::shared_ptr<Waiter>;
  using KeyWaiters = std::list<std::pair<WaiterPtr, std::size_t>>;  // waiter, index of its registration
  struct Waiter {
    ConnId conn = 0;
    std::size_t remaining = 0;
    struct Registration {
      const std::string* key = nullptr;  // the key in waiters_by_key_ (node-based: stable)
      KeyWaiters::iterator at;
      bool active = false;
    };
    std::vector<Registration> registrations;
    std::list<WaiterPtr>::iterator in_conn;
  };

  bool exists(const std::string& key) const;
  void changed(const std::string& key, std::vector<Reply>& out);
  void count_down(const WaiterPtr& w, std::size_t registration, std::vector<Reply>& out);
  void notify_watchers(const std::string& key, uint8_t kind, const std::string& old_value,
                       const std::string& new_value, std::vector<Reply>& out);
  void register_wait(ConnId conn, const std::vector<const std::string*>& missing);
  void forget_waiter(const WaiterPtr& w);
  void cancel_waits(ConnId conn);
  void store_value(const std::string& key, std::string value, std::vector<Reply>& out);
  std::optional<int64_t> counter_plus(const std::string& key, int64_t delta, const char* op,
                                      std::string& error) const;

  // One function per request, all of one shape so that handle() is a plain
  // dispatch; false: the request is malformed for the store (error says why).
  using Out = std::vector<Reply>;
  using Handler = bool (StoreState::*)(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_validate(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_ping(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_set(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_compare_set(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_get(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_add(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_check(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_wait(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_num_keys(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_watch(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_delete(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_append(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_multi_get(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_multi_set(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_cancel_wait(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_queue_push(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_queue_pop(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_queue_len(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_list_keys(ConnId conn, const Request& req, Out& out, std::string& error);
  bool on_barrier(ConnId conn, const Request& req, Out& out, std::string& error);

  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, KeyWaiters> waiters_by_key_;
  std::unordered_map<ConnId, std::list<WaiterPtr>> waiters_by_conn_;
  std::unordered_map<std::string, std::vector<ConnId>> watchers_;  // each connection once per key
  std::unordered_map<ConnId, std::size_t> watches_of_;
  std::unordered_map<ConnId, std::size_t> waited_keys_of_;
};

}  // namespace muster::store
