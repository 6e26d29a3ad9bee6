// RendezvousHost's contract (rendezvous_host.hpp): which node hosts the
// rendezvous, a port another agent already serves, the static backend's port
// shared with the store, and the node rank its host keeps for itself.
#include <catch2/catch.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <vector>

#include "exposure.hpp"
#include "muster/rendezvous/client.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "rendezvous_host.hpp"
#include "store_host.hpp"

using namespace muster;
using namespace muster::launcher;
using boost::asio::ip::tcp;

namespace {

// A port held by a listening socket: nobody else can listen on it.
struct HeldPort {
  explicit HeldPort(boost::asio::io_context& io)
      : acceptor(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)) {}
  int port() const { return acceptor.local_endpoint().port(); }
  tcp::acceptor acceptor;
};

bool accepts_connections(boost::asio::io_context& io, int port) {
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)), ec);
  return !ec;
}

const NodeNames kNames{"muster-test-node", std::nullopt};

}  // namespace

TEST_CASE("an endpoint on this node is hosted here, on the endpoint's port", "[rdzv_host]") {
  boost::asio::io_context io;
  RendezvousHost any(io, "job", std::nullopt);
  auto r = any.open_c10d(Endpoint{"127.0.0.1", 0}, kNames, std::nullopt);  // port 0: one the kernel picks
  REQUIRE(r.ok());
  CHECK(r.value());
  CHECK(any.hosting());
  REQUIRE(any.port() > 0);
  CHECK(accepts_connections(io, any.port()));

  // A port named: a second host on the same port finds it taken by the first.
  RendezvousHost named(io, "job", std::nullopt);
  auto again = named.open_c10d(Endpoint{"127.0.0.1", any.port()}, kNames, true);
  REQUIRE_FALSE(again.ok());
  CHECK_THAT(again.status().message(), Catch::Contains(std::to_string(any.port())));
}

TEST_CASE("an endpoint of another machine is joined, not hosted", "[rdzv_host]") {
  if (is_own_address("192.0.2.1")) {
    WARN("skipped: this machine has 192.0.2.1 (TEST-NET-1), the address this test needs to be another's");
    return;
  }
  boost::asio::io_context io;
  RendezvousHost host(io, "job", std::nullopt);
  auto r = host.open_c10d(Endpoint{"192.0.2.1", 29400}, kNames, std::nullopt);  // TEST-NET-1: nobody's address
  REQUIRE(r.ok());
  CHECK_FALSE(r.value());
  CHECK_FALSE(host.hosting());
  CHECK(host.port() == -1);
}

TEST_CASE("is_host overrides the guess either way, and must be a boolean", "[rdzv_host]") {
  boost::asio::io_context io;
  RendezvousHost not_here(io, "job", std::nullopt);
  auto no = not_here.open_c10d(Endpoint{"127.0.0.1", 0}, kNames, false);
  REQUIRE(no.ok());
  CHECK_FALSE(no.value());
  CHECK_FALSE(not_here.hosting());
}

TEST_CASE("a port another agent serves is joined, and with is_host=true it is an error", "[rdzv_host]") {
  boost::asio::io_context io;
  HeldPort held(io);
  RendezvousHost second(io, "job", std::nullopt);
  auto joined = second.open_c10d(Endpoint{"127.0.0.1", held.port()}, kNames, std::nullopt);
  REQUIRE(joined.ok());
  CHECK_FALSE(joined.value());
  CHECK_FALSE(second.hosting());

  RendezvousHost insisting(io, "job", std::nullopt);
  auto refused = insisting.open_c10d(Endpoint{"127.0.0.1", held.port()}, kNames, true);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::StartsWith("is_host=true, but "));
  CHECK_FALSE(insisting.hosting());
}

TEST_CASE("the static backend's node rank 0 serves the rendezvous behind the store's port", "[rdzv_host]") {
  boost::asio::io_context io;
  // In the agent's order: the host's server outlives the store whose shared port hands it connections.
  RendezvousHost host(io, "job", std::nullopt);
  StoreHost store(io, StoreHost::Emptying::by_rounds);
  REQUIRE(host.open_static(store, "127.0.0.1", 0).ok());
  CHECK(host.hosting());
  CHECK(host.port() == 0);  // no listener of its own
  REQUIRE(store.port() > 0);
  CHECK(accepts_connections(io, store.port()));

  HeldPort held(io);
  RendezvousHost other(io, "job", std::nullopt);
  StoreHost other_store(io, StoreHost::Emptying::by_rounds);
  auto st = other.open_static(other_store, "127.0.0.1", held.port());
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::StartsWith("node rank 0 cannot serve --master-port " + std::to_string(held.port())));
  CHECK_FALSE(other.hosting());
}

namespace {

// A node of a static job: a client that keeps what the rendezvous says to it.
struct StaticNode {
  StaticNode(boost::asio::io_context& io, int port, std::string name, int node_rank, std::function<void()> heard)
      : name(std::move(name)), node_rank(node_rank) {
    auto on_status = [this, heard](const Status& st) {
      error = st;
      heard();
    };
    client = std::make_shared<rendezvous::RendezvousClient>(
        io, "127.0.0.1", port,
        [this, heard](const nlohmann::json& m) {
          if (m.value("type", "") == "waiting") return;  // progress, not an answer
          messages.push_back(m);
          heard();
        },
        on_status, on_status);
  }
  void join(std::function<void()> joined = [] {}) {
    client->connect(std::chrono::seconds(20), [this, joined] {
      rendezvous::JoinMessage j;
      j.job = "job";
      j.request.node_name = name;
      j.request.address = "127.0.0.1";
      j.request.node_rank = node_rank;
      j.settings.min_nodes = j.settings.max_nodes = 2;
      j.settings.static_ranks = true;
      client->send(rendezvous::to_json(j));
      joined();
    });
  }
  std::string name;
  int node_rank;
  std::shared_ptr<rendezvous::RendezvousClient> client;
  std::vector<nlohmann::json> messages;
  std::optional<Status> error;
};

}  // namespace

TEST_CASE("the static backend's node rank 0 keeps its rank: a node claiming it, even first, is turned away",
          "[rdzv_host]") {
  boost::asio::io_context io;
  auto server = rendezvous::RendezvousServer::listen(io, "127.0.0.1", 0);
  REQUIRE(server.ok());
  server.value()->reserve_node_rank("job", 0, "host_0");
  int port = server.value()->port();
  // The twin joins first, alone; once it has its answer the owner of rank 0
  // and node rank 1 join. The loop ends when both are assigned (or on an
  // error); a twin that is never answered is a failure at the bound.
  std::function<void()> check;
  StaticNode twin(io, port, "twin_0", 0, [&] { check(); });
  StaticNode host(io, port, "host_0", 0, [&] { check(); });
  StaticNode other(io, port, "other_1", 1, [&] { check(); });
  bool others_joined = false;
  check = [&] {
    if (twin.error || host.error || other.error) return io.stop();
    if (!twin.messages.empty() && !others_joined) {
      others_joined = true;
      host.join([&] { other.join(); });
    }
    if (!host.messages.empty() && !other.messages.empty()) io.stop();
  };
  twin.join();
  io.run_for(std::chrono::seconds(30));
  for (auto* n : {&twin, &host, &other}) n->client->close();
  server.value()->close();

  REQUIRE_FALSE(twin.error);
  REQUIRE(twin.messages.size() == 1);
  CHECK(twin.messages[0]["type"] == "reject");
  CHECK_THAT(twin.messages[0]["message"].get<std::string>(),
             Catch::Contains("--node-rank=0 of node twin_0 is already taken by node host_0"));
  REQUIRE(host.messages.size() == 1);
  CHECK(host.messages[0]["type"] == "assign");
  CHECK(host.messages[0]["group_rank"] == 0);
  REQUIRE(other.messages.size() == 1);
  CHECK(other.messages[0]["type"] == "assign");
  CHECK(other.messages[0]["group_rank"] == 1);
}
