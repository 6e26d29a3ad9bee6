#include <catch2/catch.hpp>

#include "macros.hpp"

using namespace muster::launcher;

TEST_CASE("local_rank macros are substituted as string.Template.safe_substitute does", "[macros]") {
  CHECK(substitute_local_rank("--rank=$local_rank", 3) == "--rank=3");
  CHECK(substitute_local_rank("${local_rank}x", 2) == "2x");
  CHECK(substitute_local_rank("$local_rankx", 2) == "$local_rankx");
  CHECK(substitute_local_rank("cost $$5", 1) == "cost $5");
  CHECK(substitute_local_rank("$HOME and ${other} and $", 1) == "$HOME and ${other} and $");
  CHECK(substitute_local_rank("${local_rank", 1) == "${local_rank");
  CHECK(substitute_local_rank("$1", 1) == "$1");
}

TEST_CASE("the prefix template knows role_name, rank and local_rank", "[macros]") {
  CHECK(safe_substitute("[${role_name}:${rank}:$local_rank] ", {{"role_name", "r"}, {"rank", "7"}, {"local_rank", "1"}}) ==
        "[r:7:1] ");
}
