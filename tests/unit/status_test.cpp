#include <catch2/catch.hpp>

#include <string>

#include "muster/common/random.hpp"
#include "muster/common/status.hpp"

TEST_CASE("a Result's value, and the error it holds instead", "[status]") {
  muster::Result<int> good = 7;
  REQUIRE(good.ok());
  CHECK(good.value() == 7);
  CHECK(*good == 7);
  muster::Result<std::string> bad = muster::invalid_argument("--nnodes=0: give at least 1");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "--nnodes=0: give at least 1");
  // An unchecked value() says which error was missed, whatever way it is reached.
  CHECK_THROWS_WITH(bad.value(), "value() of a Result holding an error: --nnodes=0: give at least 1");
  CHECK_THROWS_AS(bad->size(), muster::BadResultAccess);
  CHECK_THROWS_AS(std::move(bad).value(), muster::BadResultAccess);
}

TEST_CASE("random ids come from the kernel, checked, in the forms asked for", "[random]") {
  auto a = muster::random_hex(16);
  auto b = muster::random_hex(16);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->size() == 32);
  CHECK(a->find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(*a != *b);
  CHECK(*a != std::string(32, '0'));
  auto u = muster::random_uuid4();
  REQUIRE(u.ok());
  REQUIRE(u->size() == 36);
  CHECK((*u)[8] == '-');
  CHECK((*u)[14] == '4');  // version 4
  CHECK(std::string("89ab").find((*u)[19]) != std::string::npos);  // RFC 4122 variant
  unsigned char none[1];
  CHECK(muster::random_bytes(none, 0).ok());
}
