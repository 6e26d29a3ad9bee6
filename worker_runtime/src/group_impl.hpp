// The state of one process group (ProcessGroup::Impl), shared by the files
// that build it: process_group.cpp (the public calls, the collectives and the
// default group) and group_bootstrap.cpp (forming the group: the store, who is
// on which node, the node's shared memory, and the TCP rings between nodes).
// Private to libmuster.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "group_settings.hpp"
#include "muster/common/status.hpp"
#include "muster/net/unique_fd.hpp"
#include "muster/process_group.hpp"
#include "muster/store/server.hpp"
#include "muster/store/store.hpp"
#include "hierarchical.hpp"
#include "ring.hpp"
#include "shm.hpp"
#include "wait.hpp"

namespace muster {
namespace detail {

// Throws the error a failed store or socket call stands for: TimeoutError for
// a timeout, Error otherwise, the message prefixed with context.
[[noreturn]] void throw_status(const Status& st, const std::string& context);

// The name of the next group made without one ("pg0", "pg1", ...).
std::string next_unnamed_group_name();

// What each rank publishes of itself when a group forms: its pid and its node
// identity, as "<pid> <node>". decode_info() checks what another rank wrote
// and throws Error naming that rank when it is malformed.
struct PeerInfo {
  std::string node;
  pid_t pid = 0;
};
std::string encode_info(const PeerInfo& p);
PeerInfo decode_info(const std::string& s, int rank);

// How the group's collectives travel, chosen once when it forms:
//   single        a group of one: nothing travels
//   shared_memory one node: every collective through the node's segment
//   ring          several nodes without shared memory (one rank per node, or
//                 nodes of different sizes): every collective round the flat ring
//   hierarchical  several nodes of equal size: all-reduce through shared
//                 memory and the cross ring (hierarchical.hpp), the other
//                 collectives round the flat ring
enum class Plan { single, shared_memory, ring, hierarchical };
// ProcessGroup::transport()'s word for a plan: "none", "shm", "tcp", "shm+tcp".
const char* plan_transport(Plan plan);

// A ring this rank is on, while it forms.
struct RingPlan {
  uint32_t id = 0;           // 0: the flat ring; 1: the cross ring
  std::vector<int> members;  // global ranks in ring order
  int position = 0;          // this rank's index in members
  net::UniqueFd next, prev;  // connected to the next member; accepted from the previous one

  int next_rank() const { return members[(position + 1) % members.size()]; }
  int prev_rank() const { return members[(position + members.size() - 1) % members.size()]; }
};

}  // namespace detail

struct MUSTER_HIDDEN ProcessGroup::Impl {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_size = 1;
  int nodes = 1;
  int restart = 0;
  std::string name;
  std::optional<int> env_local_rank, env_local_size;
  std::chrono::milliseconds timeout{};
  std::string prefix;
  detail::Plan plan = detail::Plan::single;

  // rank 0 without an agent store hosts the store on a thread of its own.
  boost::asio::io_context store_io;
  std::unique_ptr<store::StoreServer> store_server;
  std::thread store_thread;
  std::unique_ptr<store::Store> store;
  std::string local_host;  // this end's address on the store connection: how peers reach this host

  // What the plan uses: shared_memory the segment; ring the flat ring;
  // hierarchical all three.
  std::unique_ptr<detail::ShmNode> shm;
  std::unique_ptr<detail::Ring> flat;   // every rank, in rank order
  std::unique_ptr<detail::Ring> cross;  // this local index on every node

  std::string broken;  // why the group failed; non-empty: every later call is refused with it
  bool destroyed = false;
  std::mutex key_mutex;
  std::map<std::string, int> key_counts;  // next_key(): the next number per kind

  ~Impl() { close(); }

  void close() {
    shm.reset();
    flat.reset();
    cross.reset();
    store.reset();
    store_io.stop();
    if (store_thread.joinable()) store_thread.join();
    if (store_server) store_server->close();
    store_server.reset();
  }

  detail::Clock::time_point deadline() const { return detail::Clock::now() + timeout; }

  void store_check(const Status& st, const std::string& what) {
    if (!st.ok()) detail::throw_status(st, "muster: rank " + std::to_string(rank) + ": " + what);
  }
  void set(const std::string& key, const std::string& value) {
    store_check(store->set(prefix + key, value), "writing " + prefix + key + " to the store");
  }
  std::vector<std::string> get_many(const std::vector<std::string>& keys) {
    std::vector<std::string> full;
    for (auto& k : keys) full.push_back(prefix + k);
    auto r = store->multi_get(full);
    store_check(r.status(), "reading " + std::to_string(keys.size()) + " keys under " + prefix + " from the store");
    return std::move(r.value());
  }
  std::string get(const std::string& key) { return get_many({key})[0]; }
  void store_barrier(const std::string& barrier) {
    auto n = store->add(prefix + barrier + "/count", 1);
    store_check(n.status(), "joining " + barrier);
    if (n.value() == world) set(barrier + "/all", "1");
    get(barrier + "/all");
  }

  // Which ranks share a node: members per node (nodes by their lowest rank,
  // ranks in order), each rank's node, each rank's pid.
  struct Topology {
    std::vector<std::vector<int>> members;
    std::vector<int> node_of;
    std::vector<pid_t> pids;
  };
  // Set-up, in order: settings, the store, the nodes, shared memory, the rings.
  void connect(const ProcessGroupOptions& o);
  void open_store(const detail::GroupSettings& settings);
  Topology find_nodes(const detail::GroupSettings& settings);
  void open_shared_memory(const Topology& topology, std::size_t slot_bytes);
  void form_rings(const std::vector<int>& node_of, const std::vector<std::vector<int>>& members_of_node);
  std::vector<detail::RingPlan> plan_rings(const std::vector<int>& node_of,
                                          const std::vector<std::vector<int>>& members) const;
  net::UniqueFd connect_to_next(const detail::RingPlan& plan, detail::Clock::time_point until);
  void accept_from_previous(int listener, std::vector<detail::RingPlan>& plans, uint32_t token,
                            detail::Clock::time_point until);
  // Tells the connections of this group from those of an earlier one (an
  // earlier restart of the job, or an earlier group of this process).
  uint32_t ring_token() const;
};

}  // namespace muster
