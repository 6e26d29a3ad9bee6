// What a rank publishes of itself when a process group forms, and the check
// of what another rank wrote there (it comes from the store: anyone's bytes).
#include <catch2/catch.hpp>

#include "../../worker_runtime/src/group_impl.hpp"

using muster::detail::decode_info;
using muster::detail::encode_info;
using muster::detail::PeerInfo;

TEST_CASE("a rank's record goes through the store and back", "[group]") {
  PeerInfo me{"host-a/0b7c-boot id with spaces", 4242};
  PeerInfo back = decode_info(encode_info(me), 3);
  CHECK(back.pid == 4242);
  CHECK(back.node == me.node);
}

TEST_CASE("a malformed record is muster's Error naming the rank", "[group]") {
  for (const char* bad : {"", "4242", " node", "abc node", "42x node", "-5 node", "0 node",
                          "99999999999999999999 node"}) {
    INFO(bad);
    CHECK_THROWS_AS(decode_info(bad, 7), muster::Error);
    CHECK_THROWS_WITH(decode_info(bad, 7), Catch::Contains("rank 7 published a malformed record"));
  }
}
