#include "muster/process_group.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "muster/net/socket.hpp"
#include "muster/store/client.hpp"
#include "group_settings.hpp"
#include "muster/store/server.hpp"
#include "reduce.hpp"
#include "ring.hpp"
#include "shm.hpp"

namespace muster {

using detail::Clock;
using detail::env;

namespace {

constexpr uint32_t kHelloMagic = 0x4d535247;  // "MSRG"
// A ring socket's kernel buffers: room for a whole segment in flight.
constexpr int kRingSocketBuffer = 4 << 20;
// How long an accepted connection may take to send its greeting.
constexpr auto kGreetingLimit = std::chrono::seconds(10);

// The process's one piece of shared state: the default group, and the count
// of unnamed groups made so far (which names the next one).
struct Registry {
  std::mutex mutex;
  ProcessGroup default_group;  // guarded by mutex
  std::atomic<int> unnamed_groups{0};
};
Registry& registry() {
  static Registry r;
  return r;
}

// Throws the error a failed store or socket call stands for.
[[noreturn]] void throw_status(const Status& st, const std::string& context) {
  std::string msg = context + ": " + st.message();
  if (st.code() == Code::timeout) throw TimeoutError(msg);
  throw Error(msg);
}

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string random_hex(int bytes) {
  std::random_device rd;
  std::ostringstream os;
  for (int i = 0; i < bytes; ++i) {
    os << "0123456789abcdef"[rd() & 15] << "0123456789abcdef"[rd() & 15];
  }
  return os.str();
}

struct PeerInfo {
  std::string node;
  pid_t pid = 0;
};

std::string encode_info(const PeerInfo& p) { return std::to_string(p.pid) + " " + p.node; }
PeerInfo decode_info(const std::string& s, int rank) {
  auto sp = s.find(' ');
  if (sp == std::string::npos) throw Error("muster: rank " + std::to_string(rank) + " published a malformed record");
  return PeerInfo{s.substr(sp + 1), static_cast<pid_t>(std::stol(s.substr(0, sp)))};
}

struct Hello {
  uint32_t magic;
  uint32_t ring;
  uint32_t from;
  uint32_t token;
};

// A ring this rank is on, while it forms.
struct RingPlan {
  uint32_t id = 0;           // 0: the flat ring; 1: the cross ring
  std::vector<int> members;  // global ranks in ring order
  int position = 0;          // this rank's index in members
  net::UniqueFd next, prev;  // connected to the next member; accepted from the previous one

  int next_rank() const { return members[(position + 1) % members.size()]; }
  int prev_rank() const { return members[(position + members.size() - 1) % members.size()]; }
};

}  // namespace

struct ProcessGroup::Impl {
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
  std::string transport = "none";

  // rank 0 without an agent store hosts the store on a thread of its own.
  boost::asio::io_context store_io;
  std::unique_ptr<store::StoreServer> store_server;
  std::thread store_thread;
  std::unique_ptr<store::Store> store;
  std::string local_host;  // this end's address on the store connection: how peers reach this host

  std::unique_ptr<detail::ShmNode> shm;
  std::unique_ptr<detail::TcpRing> flat;   // every rank, in rank order (when nodes > 1)
  std::unique_ptr<detail::TcpRing> cross;  // this local index on every node (hierarchical all_reduce)

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

  Clock::time_point deadline() const { return Clock::now() + timeout; }

  void store_check(const Status& st, const std::string& what) {
    if (!st.ok()) throw_status(st, "muster: rank " + std::to_string(rank) + ": " + what);
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
  std::vector<RingPlan> plan_rings(const std::vector<int>& node_of, const std::vector<std::vector<int>>& members) const;
  net::UniqueFd connect_to_next(const RingPlan& plan, Clock::time_point until);
  void accept_from_previous(int listener, std::vector<RingPlan>& plans, uint32_t token, Clock::time_point until);
  // Tells the connections of this group from those of an earlier one (an
  // earlier restart of the job, or an earlier group of this process).
  uint32_t ring_token() const;
};

void ProcessGroup::Impl::connect(const ProcessGroupOptions& o) {
  auto settings = detail::read_group_settings(o);
  rank = settings.rank;
  world = settings.world;
  env_local_rank = settings.local_rank;
  env_local_size = settings.local_size;
  restart = settings.restart;
  timeout = settings.timeout;
  name = settings.name.empty() ? "pg" + std::to_string(registry().unnamed_groups.fetch_add(1)) : settings.name;
  open_store(settings);
  // Named groups have a folder of their own, so no name meets a default one.
  prefix = "muster/attempt_" + std::to_string(restart) + "/" + (settings.name.empty() ? name : "named/" + name) + "/";

  auto topology = find_nodes(settings);
  nodes = static_cast<int>(topology.members.size());
  const auto& mine = topology.members[topology.node_of[rank]];
  local_size = static_cast<int>(mine.size());
  local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  bool uniform = std::all_of(topology.members.begin(), topology.members.end(),
                             [&](auto& m) { return m.size() == mine.size(); });
  // Shared memory among the node's ranks (not when node sizes differ: then
  // every collective goes round one TCP ring).
  if (local_size > 1 && (nodes == 1 || uniform)) open_shared_memory(topology, settings.slot_bytes);
  if (nodes > 1) form_rings(topology.node_of, topology.members);
  if (nodes == 1) {
    transport = world == 1 ? "none" : "shm";
  } else {
    transport = shm ? "shm+tcp" : "tcp";
  }
  // Every rank has read what it needs from the store before anyone returns
  // (rank 0 may host the store and leave).
  store_barrier("ready");
}

void ProcessGroup::Impl::open_store(const detail::GroupSettings& settings) {
  if (!settings.agent_store && rank == 0) {
    auto server = store::StoreServer::listen(store_io, "", settings.master_port);
    if (!server.ok()) {
      throw Error("muster: rank 0 cannot host the store on port " + std::to_string(settings.master_port) + ": " +
                  server.status().message() + "; choose another MASTER_PORT");
    }
    store_server = std::move(server.value());
    store_thread = std::thread([this] { store_io.run(); });
  }
  store::ClientOptions copts;
  copts.timeout = timeout;
  auto client = store::StoreClient::connect(settings.master_addr, settings.master_port, copts);
  if (!client.ok()) {
    std::string msg = "muster: rank " + std::to_string(rank) + ": " + client.status().message();
    if (client.status().code() == Code::timeout || client.status().code() == Code::unavailable) throw TimeoutError(msg);
    throw Error(msg);
  }
  local_host = client->local_host();
  store = std::make_unique<store::StoreClient>(std::move(client.value()));
}

// Who is where: every rank publishes its pid and node identity; ranks with one
// identity form a node, nodes ordered by their lowest rank.
ProcessGroup::Impl::Topology ProcessGroup::Impl::find_nodes(const detail::GroupSettings& settings) {
  PeerInfo me;
  me.pid = getpid();
  if (settings.tcp_only) {
    me.node = "rank" + std::to_string(rank);
  } else if (settings.node_id) {
    me.node = "id:" + *settings.node_id;
  } else {
    me.node = host_name() + "/" + boot_id();
  }
  set("info/" + std::to_string(rank), encode_info(me));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("info/" + std::to_string(r));
  auto values = get_many(keys);
  Topology t;
  std::map<std::string, int> node_index;
  t.node_of.resize(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    PeerInfo peer = decode_info(values[r], r);
    auto [it, fresh] = node_index.emplace(peer.node, static_cast<int>(t.members.size()));
    if (fresh) t.members.emplace_back();
    t.node_of[r] = it->second;
    t.members[it->second].push_back(r);
    t.pids.push_back(peer.pid);
  }
  return t;
}

// The node's first rank creates the segment, the others map it, and its name
// goes once every local rank has: a crash from then on leaves nothing in /dev/shm.
void ProcessGroup::Impl::open_shared_memory(const Topology& topology, std::size_t slot) {
  const auto& mine = topology.members[topology.node_of[rank]];
  std::vector<pid_t> pids;
  for (int r : mine) pids.push_back(topology.pids[r]);
  std::string node_key = "shm/" + std::to_string(mine.front());
  if (local_rank == 0) {
    std::string name = "/muster-" + std::to_string(getpid()) + "-" + random_hex(8);
    shm = std::make_unique<detail::ShmNode>(name, true, 0, local_size, slot, pids, mine);
    std::vector<std::string> opened;
    for (int j = 1; j < local_size; ++j) opened.push_back("shm_open/" + std::to_string(mine[j]));
    try {
      set(node_key, name);
      get_many(opened);
    } catch (...) {
      detail::ShmNode::unlink(name);
      throw;
    }
    detail::ShmNode::unlink(name);
  } else {
    std::string name = get(node_key);
    try {
      shm = std::make_unique<detail::ShmNode>(name, false, local_rank, local_size, slot, pids, mine);
    } catch (...) {
      detail::ShmNode::unlink(name);  // any rank may: the group cannot form anyway
      throw;
    }
    set("shm_open/" + std::to_string(rank), "1");
  }
}

std::vector<RingPlan> ProcessGroup::Impl::plan_rings(const std::vector<int>& node_of,
                                                     const std::vector<std::vector<int>>& members) const {
  std::vector<RingPlan> plans;
  RingPlan flat_plan;  // every rank, in rank order
  flat_plan.id = 0;
  flat_plan.position = rank;
  for (int r = 0; r < world; ++r) flat_plan.members.push_back(r);
  plans.push_back(std::move(flat_plan));
  if (shm) {  // hierarchical all_reduce: this local index on every node, in node order
    RingPlan cross_plan;
    cross_plan.id = 1;
    cross_plan.position = node_of[rank];
    for (const auto& node : members) cross_plan.members.push_back(node[local_rank]);
    plans.push_back(std::move(cross_plan));
  }
  return plans;
}

uint32_t ProcessGroup::Impl::ring_token() const {
  // The group's key prefix (its attempt, and whether it is named, as well as
  // its name), hashed the same way in every process (FNV-1a), plus the restart
  // count times a prime, so that restarts and names do not cancel out.
  uint32_t h = 2166136261u;
  for (unsigned char c : prefix) h = (h ^ c) * 16777619u;
  return h + static_cast<uint32_t>(restart) * 7919u;
}

// Connects to the plan's next member, retrying while it is not listening yet.
net::UniqueFd ProcessGroup::Impl::connect_to_next(const RingPlan& plan, Clock::time_point until) {
  const int next = plan.next_rank();
  const std::string advertised = get("addr/" + std::to_string(next));
  const auto sp = advertised.rfind(' ');
  char* end = nullptr;
  const long port = sp == std::string::npos ? -1 : std::strtol(advertised.c_str() + sp + 1, &end, 10);
  if (sp == std::string::npos || end == nullptr || *end != '\0' || port <= 0 || port > 65535) {
    throw Error("muster: rank " + std::to_string(next) + " advertised an unusable address '" + advertised + "'");
  }
  const std::string host = advertised.substr(0, sp);
  auto backoff = std::chrono::milliseconds(20);
  Status last;
  while (true) {
    auto fd = net::connect_tcp(host, static_cast<int>(port), until, true);
    if (fd.ok()) {
      net::tune_socket(fd->get(), kRingSocketBuffer);
      return std::move(fd.value());
    }
    last = fd.status();
    if (last.code() == Code::invalid_argument || Clock::now() + backoff >= until) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  throw TimeoutError("muster: rank " + std::to_string(rank) + " cannot connect to rank " + std::to_string(next) +
                     " at " + advertised + ": " + last.message() +
                     " (a firewall? set MUSTER_ADVERTISE_ADDR to an address peers reach)");
}

// Accepts one connection per ring, from its previous member; others (strays,
// or connections of an earlier group) are closed.
void ProcessGroup::Impl::accept_from_previous(int listener, std::vector<RingPlan>& plans, uint32_t token,
                                              Clock::time_point until) {
  std::size_t missing = plans.size();
  while (missing > 0) {
    if (Clock::now() >= until) {
      throw TimeoutError("muster: rank " + std::to_string(rank) + " timed out waiting for its ring peers to connect");
    }
    pollfd pf{listener, POLLIN, 0};
    ::poll(&pf, 1, net::poll_timeout_ms(until, 1000));
    net::UniqueFd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) continue;
    Hello h{};
    if (!net::recv_all(fd.get(), &h, sizeof h, std::min(until, Clock::now() + kGreetingLimit), "a ring peer").ok()) {
      continue;
    }
    if (h.magic != kHelloMagic || h.token != token) continue;
    for (auto& p : plans) {
      if (p.id == h.ring && static_cast<int>(h.from) == p.prev_rank() && !p.prev) {
        net::tune_socket(fd.get(), kRingSocketBuffer);
        p.prev = std::move(fd);
        --missing;
        break;
      }
    }
  }
}

void ProcessGroup::Impl::form_rings(const std::vector<int>& node_of, const std::vector<std::vector<int>>& members) {
  const auto until = deadline();
  std::string host = local_host;
  if (auto a = env("MUSTER_ADVERTISE_ADDR"); a && !a->empty()) host = *a;
  if (host.empty()) host = "127.0.0.1";
  const bool v6 = host.find(':') != std::string::npos;
  auto listener = net::listen_tcp(0, 1024, v6 ? net::Family::ipv6 : net::Family::ipv4, true);
  if (!listener.ok()) throw_status(listener.status(), "muster: cannot listen for the ring's peers");
  set("addr/" + std::to_string(rank), host + " " + std::to_string(listener->port));

  std::vector<RingPlan> plans = plan_rings(node_of, members);
  const uint32_t token = ring_token();
  for (auto& p : plans) {
    p.next = connect_to_next(p, until);
    Hello h{kHelloMagic, p.id, static_cast<uint32_t>(rank), token};
    const std::string peer = "rank " + std::to_string(p.next_rank());
    if (auto st = net::send_all(p.next.get(), &h, sizeof h, until, peer); !st.ok()) {
      throw_status(st, "muster: rank " + std::to_string(rank) + " cannot greet its ring peer");
    }
  }
  accept_from_previous(listener->fd.get(), plans, token, until);
  for (auto& p : plans) {
    auto ring = std::make_unique<detail::TcpRing>(p.members, p.position, std::move(p.next), std::move(p.prev));
    (p.id == 0 ? flat : cross) = std::move(ring);
  }
}

ProcessGroup ProcessGroup::create(const ProcessGroupOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->connect(options);
  return ProcessGroup(std::move(impl));
}

ProcessGroup::Impl& ProcessGroup::impl() const {
  if (!impl_) throw Error("muster: this ProcessGroup handle is empty (create one with muster::init_process_group)");
  if (impl_->destroyed) throw Error("muster: the process group was destroyed");
  return *impl_;
}

int ProcessGroup::rank() const { return impl().rank; }
int ProcessGroup::size() const { return impl().world; }
int ProcessGroup::local_rank() const { return impl().env_local_rank.value_or(impl().local_rank); }
int ProcessGroup::local_size() const { return impl().env_local_size.value_or(impl().local_size); }
int ProcessGroup::node_count() const { return impl().nodes; }
int ProcessGroup::restart_count() const { return impl().restart; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl().timeout; }
std::string ProcessGroup::transport() const { return impl().transport; }

void ProcessGroup::check_span_sizes(const char* what, std::size_t small, std::size_t big) const {
  if (big != small * static_cast<std::size_t>(size())) {
    throw Error(std::string("muster: ") + what + ": the larger buffer must hold size() = " + std::to_string(size()) +
                " times the smaller one's " + std::to_string(small) + " elements, it holds " + std::to_string(big));
  }
}

namespace {

// Runs one collective: an unusable group refuses, a failure marks the group
// unusable, tells the node's ranks and the ring neighbours, and rethrows with
// the rank and the operation named.
template <typename F>
void run_collective(ProcessGroup::Impl& g, const std::string& what, F&& body) {
  if (!g.broken.empty()) {
    throw Error("muster: rank " + std::to_string(g.rank) + ": " + what +
                ": the process group is unusable after an earlier failure (" + g.broken +
                "); destroy it and let the launcher restart the job");
  }
  try {
    body();
  } catch (const TimeoutError& e) {
    g.broken = e.what();
    if (g.shm) g.shm->abort(g.rank);
    if (g.flat) g.flat->shut();
    if (g.cross) g.cross->shut();
    throw TimeoutError("muster: rank " + std::to_string(g.rank) + ": " + what + " timed out after " +
                       std::to_string(g.timeout.count()) + " ms: " + e.what());
  } catch (const Error& e) {
    g.broken = e.what();
    if (g.shm) g.shm->abort(g.rank);
    if (g.flat) g.flat->shut();
    if (g.cross) g.cross->shut();
    throw Error("muster: rank " + std::to_string(g.rank) + ": " + what + " failed: " + e.what());
  }
}

std::string describe(const char* op, std::size_t count, DataType type) {
  return std::string(op) + " of " + std::to_string(count) + " " + data_type_name(type);
}

void check_buffer(const void* p, std::size_t count, DataType type, const char* what) {
  if (count > 0 && p == nullptr) throw Error(std::string("muster: ") + what + ": a null buffer for " + std::to_string(count) + " elements");
  if (count > (SIZE_MAX / 16) / element_size(type)) throw Error(std::string("muster: ") + what + ": the element count overflows");
}

}  // namespace

void ProcessGroup::all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) {
  auto& g = impl();
  check_buffer(data, count, type, "all_reduce");
  run_collective(g, describe("all_reduce", count, type), [&] {
    const int divisor = op == ReduceOp::avg ? g.world : 1;
    auto until = g.deadline();
    if (g.world == 1) return;
    if (g.shm) {
      // cross is set when there are other nodes: hierarchical.
      g.shm->all_reduce(data, count, type, op, divisor, g.cross.get(), until);
    } else {
      g.flat->all_reduce(data, count, type, op, divisor, until);
    }
  });
}

void ProcessGroup::broadcast(void* data, std::size_t count, DataType type, int root) {
  auto& g = impl();
  check_buffer(data, count, type, "broadcast");
  if (root < 0 || root >= g.world) {
    throw Error("muster: broadcast: root " + std::to_string(root) + " is outside [0, " + std::to_string(g.world) + ")");
  }
  run_collective(g, describe("broadcast", count, type), [&] {
    auto until = g.deadline();
    if (g.world == 1) return;
    if (g.nodes == 1) {
      g.shm->broadcast(data, count * element_size(type), root, until);
    } else {
      g.flat->broadcast(data, count * element_size(type), root, until);
    }
  });
}

void ProcessGroup::all_gather(const void* in, void* out, std::size_t count, DataType type) {
  auto& g = impl();
  check_buffer(in, count, type, "all_gather");
  check_buffer(out, count * g.world, type, "all_gather");
  run_collective(g, describe("all_gather", count, type), [&] {
    const std::size_t bytes = count * element_size(type);
    auto until = g.deadline();
    if (g.nodes == 1 && g.world > 1) {
      g.shm->all_gather(in, out, bytes, until);
      return;
    }
    char* o = static_cast<char*>(out);
    if (bytes > 0) std::memmove(o + g.rank * bytes, in, bytes);
    if (g.world > 1 && bytes > 0) g.flat->all_gather_in_place(out, bytes, until);
  });
}

void ProcessGroup::reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op) {
  auto& g = impl();
  check_buffer(in, count * g.world, type, "reduce_scatter");
  check_buffer(out, count, type, "reduce_scatter");
  run_collective(g, describe("reduce_scatter", count, type), [&] {
    auto until = g.deadline();
    const int divisor = op == ReduceOp::avg ? g.world : 1;
    if (g.world == 1) {
      if (count > 0) std::memmove(out, in, count * element_size(type));
      return;
    }
    if (count == 0) return;
    if (g.nodes == 1) {
      g.shm->reduce_scatter(in, out, count, type, op, until);
    } else {
      g.flat->reduce_scatter(in, out, count, type, op, divisor, until);
    }
  });
}

void ProcessGroup::barrier() {
  auto& g = impl();
  run_collective(g, "barrier", [&] {
    auto until = g.deadline();
    if (g.world == 1) return;
    if (g.nodes == 1) {
      g.shm->barrier(until);
    } else {
      g.flat->barrier(until);
    }
  });
}

void ProcessGroup::store_set(const std::string& key, const std::string& value) { impl().set("user/" + key, value); }

const std::string& ProcessGroup::name() const { return impl().name; }

std::string ProcessGroup::next_key(const std::string& kind) {
  auto& i = impl();
  std::lock_guard lock(i.key_mutex);
  return kind + "/" + std::to_string(i.key_counts[kind]++);
}
std::string ProcessGroup::store_get(const std::string& key) { return impl().get("user/" + key); }

void ProcessGroup::destroy() {
  if (!impl_ || impl_->destroyed) return;
  impl_->close();
  impl_->destroyed = true;
}

ProcessGroup init_process_group(const ProcessGroupOptions& options) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.default_group.valid()) {
    throw Error("muster: init_process_group was called twice; call destroy_process_group() first");
  }
  r.default_group = ProcessGroup::create(options);
  return r.default_group;
}

void destroy_process_group() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.default_group.valid()) r.default_group.destroy();
  r.default_group = ProcessGroup();
}

bool is_initialized() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  return r.default_group.valid();
}

ProcessGroup default_group() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.default_group.valid()) {
    throw Error("muster: the default process group is not initialized; call muster::init_process_group() first");
  }
  return r.default_group;
}

int get_rank() { return default_group().rank(); }
int get_world_size() { return default_group().size(); }
int get_local_rank() { return default_group().local_rank(); }

}  // namespace muster
