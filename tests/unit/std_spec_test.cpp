#include <catch2/catch.hpp>

#include "std_spec.hpp"

using namespace muster::launcher;

TEST_CASE("redirect and tee values: one for all or a per-rank map", "[std]") {
  CHECK(StdSpec::parse("3")->for_rank(9) == 3);
  auto m = StdSpec::parse("0:1,1:2,12:3");
  REQUIRE(m.ok());
  CHECK(m->for_rank(0) == 1);
  CHECK(m->for_rank(1) == 2);
  CHECK(m->for_rank(12) == 3);
  CHECK(m->for_rank(2) == 0);
  for (const char* bad : {"4", "", "0:4", "0:1,", ":1", "a", "0:1,,1:2", "1:"}) {
    INFO(bad);
    CHECK_FALSE(StdSpec::parse(bad).ok());
  }
}
