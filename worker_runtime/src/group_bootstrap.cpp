// Forming a process group (group_impl.hpp): its settings from the
// environment, the store (hosted by rank 0 when no agent hosts one), who is on
// which node, the node's shared-memory segment, and the TCP rings between nodes.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "group_impl.hpp"
#include "muster/common/random.hpp"
#include "muster/net/socket.hpp"
#include "muster/store/client.hpp"

namespace muster {

using detail::Clock;
using detail::env;
using detail::decode_info;
using detail::encode_info;
using detail::PeerInfo;
using detail::RingPlan;
using detail::throw_status;

namespace {

constexpr uint32_t kHelloMagic = 0x4d535247;  // "MSRG"
// A ring socket's kernel buffers: room for a whole segment in flight.
constexpr int kRingSocketBuffer = 4 << 20;
// How long an accepted connection may take to send its greeting.
constexpr auto kGreetingLimit = std::chrono::seconds(10);

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

struct Hello {
  uint32_t magic;
  uint32_t ring;
  uint32_t from;
  uint32_t token;
};

}  // namespace

std::string detail::encode_info(const detail::PeerInfo& p) { return std::to_string(p.pid) + " " + p.node; }

detail::PeerInfo detail::decode_info(const std::string& s, int rank) {
  auto malformed = [&] {
    return Error("muster: rank " + std::to_string(rank) + " published a malformed record '" + s.substr(0, 64) + "'");
  };
  auto sp = s.find(' ');
  if (sp == std::string::npos || sp == 0) throw malformed();
  char* end = nullptr;
  errno = 0;
  long pid = std::strtol(s.c_str(), &end, 10);
  if (end != s.c_str() + sp || errno != 0 || pid <= 0 || pid > std::numeric_limits<pid_t>::max()) throw malformed();
  return detail::PeerInfo{s.substr(sp + 1), static_cast<pid_t>(pid)};
}

void ProcessGroup::Impl::connect(const ProcessGroupOptions& o) {
  auto settings = detail::read_group_settings(o);
  rank = settings.rank;
  world = settings.world;
  env_local_rank = settings.local_rank;
  env_local_size = settings.local_size;
  restart = settings.restart;
  timeout = settings.timeout;
  name = settings.name.empty() ? detail::next_unnamed_group_name() : settings.name;
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
    plan = world == 1 ? detail::Plan::single : detail::Plan::shared_memory;
  } else {
    plan = shm ? detail::Plan::hierarchical : detail::Plan::ring;
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
    auto suffix = muster::random_hex(8);
    if (!suffix.ok()) throw Error("muster: cannot name the shared-memory segment: " + suffix.status().message());
    std::string name = "/muster-" + std::to_string(getpid()) + "-" + suffix.value();
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
    auto ring = std::make_unique<detail::Ring>(
        std::make_unique<detail::TcpLink>(p.members, p.position, std::move(p.next), std::move(p.prev)));
    (p.id == 0 ? flat : cross) = std::move(ring);
  }
}

}  // namespace muster
