#include <catch2/catch.hpp>

#include "muster/rendezvous/protocol.hpp"

using namespace muster::rendezvous;

TEST_CASE("frames are a big-endian length and JSON, read back whole", "[frames]") {
  std::string a = encode_frame({{"type", "heartbeat"}, {"v", 1}});
  CHECK(static_cast<unsigned char>(a[0]) == 0);
  CHECK(static_cast<unsigned char>(a[3]) == a.size() - 4);
  std::string b = encode_frame({{"type", "leave"}, {"v", 1}});
  FrameReader r;
  std::string both = a + b;
  for (std::size_t i = 0; i < both.size(); ++i) {
    r.feed(std::string_view(both).substr(i, 1));
    if (i + 1 < a.size()) CHECK_FALSE(r.next().value().has_value());
  }
  auto first = r.next();
  REQUIRE(first.ok());
  REQUIRE(first.value());
  CHECK(parse_message(*first.value()).value()["type"] == "heartbeat");
  CHECK(parse_message(r.next().value().value()).value()["type"] == "leave");
  CHECK_FALSE(r.next().value().has_value());
}

TEST_CASE("an oversized frame breaks the stream before any allocation", "[frames]") {
  FrameReader r;
  r.feed(std::string("\x00\x20\x00\x00", 4));  // 2 MiB
  CHECK_FALSE(r.next().ok());
}

TEST_CASE("messages need a type and this protocol version", "[frames]") {
  CHECK_FALSE(parse_message("[1,2]").ok());
  CHECK_FALSE(parse_message(R"({"v":1})").ok());
  CHECK(parse_message(R"({"type":"x","v":2})").status().message().find("version 2 is not supported") != std::string::npos);
  CHECK(parse_message(R"({"type":"x","v":1})").ok());
}

TEST_CASE("a join survives the round trip and bad settings are refused", "[frames]") {
  JoinMessage m;
  m.job = "job42";
  m.request.node_name = "n1";
  m.request.address = "10.0.0.1";
  m.request.local_world_size = 8;
  m.request.node_rank = 3;
  m.settings.min_nodes = 2;
  m.settings.max_nodes = 4;
  m.settings.keep_alive_interval = std::chrono::milliseconds(1500);
  auto back = join_from_json(to_json(m));
  REQUIRE(back.ok());
  CHECK(back->job == "job42");
  CHECK(back->request.local_world_size == 8);
  CHECK(back->request.node_rank == 3);
  CHECK(back->settings.max_nodes == 4);
  CHECK(back->settings.keep_alive_interval.count() == 1500);
  auto j = to_json(m);
  j["settings"]["min_nodes"] = 5;
  CHECK(join_from_json(j).status().message().find("min_nodes must be > 0 and <= max_nodes") == 0);
  j = to_json(m);
  j["local_world_size"] = "eight";
  CHECK_FALSE(join_from_json(j).ok());
  j.erase("job");
  CHECK_FALSE(join_from_json(j).ok());
}
