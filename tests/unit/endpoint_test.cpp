#include <catch2/catch.hpp>

#include "muster/common/endpoint.hpp"

using muster::parse_endpoint;

TEST_CASE("endpoints parse host, port, brackets and defaults", "[endpoint]") {
  auto a = parse_endpoint("head:29400", 1);
  REQUIRE(a.ok());
  CHECK(a->host == "head");
  CHECK(a->port == 29400);
  auto b = parse_endpoint("[::1]:80", 1);
  REQUIRE(b.ok());
  CHECK(b->host == "::1");
  CHECK(b->port == 80);
  CHECK(b->to_string() == "[::1]:80");
  auto c = parse_endpoint("", 29400);
  CHECK(c->host == "localhost");
  CHECK(c->port == 29400);
  auto d = parse_endpoint("node1", 29400);
  CHECK(d->port == 29400);
}

TEST_CASE("bad endpoints name the endpoint", "[endpoint]") {
  auto p = parse_endpoint("h:70000", 1);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("'h:70000'") != std::string::npos);
  CHECK_FALSE(parse_endpoint("h:x1", 1).ok());
  CHECK_FALSE(parse_endpoint("bad host:1", 1).ok());
  CHECK_FALSE(parse_endpoint("[::1:5", 1).ok());
}
