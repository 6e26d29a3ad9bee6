// RendezvousHost's contract (rendezvous_host.hpp): which node hosts the
// rendezvous, a port another agent already serves, and the static backend's
// port shared with the store.
#include <catch2/catch.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "exposure.hpp"
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
  auto r = any.open_c10d(Endpoint{"127.0.0.1", 0}, kNames, {});  // port 0: one the kernel picks
  REQUIRE(r.ok());
  CHECK(r.value());
  CHECK(any.hosting());
  REQUIRE(any.port() > 0);
  CHECK(accepts_connections(io, any.port()));

  // A port named: a second host on the same port finds it taken by the first.
  RendezvousHost named(io, "job", std::nullopt);
  auto again = named.open_c10d(Endpoint{"127.0.0.1", any.port()}, kNames, {{"is_host", "true"}});
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
  auto r = host.open_c10d(Endpoint{"192.0.2.1", 29400}, kNames, {});  // TEST-NET-1: nobody's address
  REQUIRE(r.ok());
  CHECK_FALSE(r.value());
  CHECK_FALSE(host.hosting());
  CHECK(host.port() == -1);
}

TEST_CASE("is_host overrides the guess either way, and must be a boolean", "[rdzv_host]") {
  boost::asio::io_context io;
  RendezvousHost not_here(io, "job", std::nullopt);
  auto no = not_here.open_c10d(Endpoint{"127.0.0.1", 0}, kNames, {{"is_host", "false"}});
  REQUIRE(no.ok());
  CHECK_FALSE(no.value());
  CHECK_FALSE(not_here.hosting());

  RendezvousHost bad(io, "job", std::nullopt);
  auto maybe = bad.open_c10d(Endpoint{"127.0.0.1", 0}, kNames, {{"is_host", "maybe"}});
  REQUIRE_FALSE(maybe.ok());
  CHECK_THAT(maybe.status().message(), Catch::Contains("'is_host' does not represent a valid boolean value"));
}

TEST_CASE("a port another agent serves is joined; with is_host=true it is an error", "[rdzv_host]") {
  boost::asio::io_context io;
  HeldPort held(io);
  RendezvousHost second(io, "job", std::nullopt);
  auto joined = second.open_c10d(Endpoint{"127.0.0.1", held.port()}, kNames, {});
  REQUIRE(joined.ok());
  CHECK_FALSE(joined.value());
  CHECK_FALSE(second.hosting());

  RendezvousHost insisting(io, "job", std::nullopt);
  auto refused = insisting.open_c10d(Endpoint{"127.0.0.1", held.port()}, kNames, {{"is_host", "true"}});
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::StartsWith("is_host=true, but "));
  CHECK_FALSE(insisting.hosting());
}

TEST_CASE("the static backend's node rank 0 serves the rendezvous behind the store's port", "[rdzv_host]") {
  boost::asio::io_context io;
  // In the agent's order: the host's server outlives the store whose shared port hands it connections.
  RendezvousHost host(io, "job", std::nullopt);
  StoreHost store(io);
  REQUIRE(host.open_static(store, "127.0.0.1", 0).ok());
  CHECK(host.hosting());
  CHECK(host.port() == 0);  // no listener of its own
  REQUIRE(store.port() > 0);
  CHECK(accepts_connections(io, store.port()));

  HeldPort held(io);
  RendezvousHost other(io, "job", std::nullopt);
  StoreHost other_store(io);
  auto st = other.open_static(other_store, "127.0.0.1", held.port());
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::StartsWith("node rank 0 cannot serve --master-port " + std::to_string(held.port())));
  CHECK_FALSE(other.hosting());
}
