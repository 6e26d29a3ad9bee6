#include <catch2/catch.hpp>

#include <string>

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
