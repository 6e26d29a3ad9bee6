#include <catch2/catch.hpp>

#include "muster/rendezvous/rank_assignment.hpp"

using namespace muster::rendezvous;

TEST_CASE("ranks follow group rank order and each node's local world size", "[rendezvous]") {
  auto r = assign_worker_ranks({{"default", 1}, {"default", 3}});
  REQUIRE(r.size() == 2);
  CHECK(r[0].base_global_rank == 0);
  CHECK(r[1].base_global_rank == 1);
  CHECK(r[0].global_world_size == 4);
  CHECK(r[1].role_world_size == 4);
}

TEST_CASE("role ranks count only nodes of the same role", "[rendezvous]") {
  auto r = assign_worker_ranks({{"trainer", 2}, {"eval", 1}, {"trainer", 2}});
  CHECK(r[0].base_role_rank == 0);
  CHECK(r[0].role_world_size == 4);
  CHECK(r[1].base_global_rank == 2);
  CHECK(r[1].base_role_rank == 0);
  CHECK(r[1].role_world_size == 1);
  CHECK(r[2].base_global_rank == 3);
  CHECK(r[2].base_role_rank == 2);
  CHECK(r[2].global_world_size == 5);
}
