// The rendezvous's board of nodes that fail their health check: kept per job
// until the node joins or its report is stale, bounded per job and in all.
#include <catch2/catch.hpp>

#include "muster/rendezvous/health_board.hpp"

using namespace muster::rendezvous;

namespace {

HealthReport failing(const std::string& job, const std::string& node, long long retry_in_ms = 5000) {
  HealthReport r;
  r.job = job;
  r.node = node;
  r.address = node.substr(0, node.find('_'));
  r.detail = "exit 1";
  r.retry_in_ms = retry_in_ms;
  return r;
}

}  // namespace

TEST_CASE("a failing node is shown until it joins, and a newer report replaces its older one", "[health]") {
  HealthBoard b;
  TimePoint t0{};
  b.report(failing("j", "10.0.0.2_a"), t0);
  b.report(failing("j", "10.0.0.1_b"), t0);
  b.report(failing("other", "10.0.0.3_c"), t0);
  auto shown = b.of("j", t0);
  REQUIRE(shown.size() == 2);
  CHECK(shown[0].report.address == "10.0.0.1");  // by address
  auto again = failing("j", "10.0.0.2_a");
  again.failures = 2;
  b.report(again, t0 + Duration(6000));
  shown = b.of("j", t0 + Duration(6000));
  REQUIRE(shown.size() == 2);
  CHECK(shown[1].report.failures == 2);
  CHECK(shown[1].reported == t0 + Duration(6000));
  CHECK(b.entries() == 3);
  b.joined("j", "10.0.0.2_a");
  CHECK(b.of("j", t0 + Duration(6000)).size() == 1);
  b.joined("j", "10.0.0.9_unknown");  // a node that never failed: nothing changes
  b.joined("nosuchjob", "x");
  CHECK(b.entries() == 2);
}

TEST_CASE("a report is dropped once its node is past its retry and the grace without a word", "[health]") {
  HealthBoard b;
  TimePoint t0{};
  b.report(failing("j", "10.0.0.2_a", 5000), t0);
  b.report(failing("j", "10.0.0.3_b", 0), t0);  // after a periodic check: it decides when
  const TimePoint due = t0 + Duration(5000) + kHealthReportGrace;
  CHECK(b.live(t0 + kHealthReportGrace - Duration(1)) == 2);
  CHECK(b.of("j", t0 + kHealthReportGrace - Duration(1)).size() == 2);
  auto left = b.of("j", t0 + kHealthReportGrace);
  REQUIRE(left.size() == 1);
  CHECK(left[0].report.node == "10.0.0.2_a");
  CHECK(b.live(due - Duration(1)) == 1);
  CHECK(b.live(due) == 0);
  CHECK(b.of("j", due).empty());
  CHECK(b.jobs() == 0);
  CHECK(b.entries() == 0);
  // A check that may run long is waited for too.
  auto slow = failing("j", "10.0.0.4_d", 5000);
  slow.check_timeout_ms = 600000;
  b.report(slow, t0);
  CHECK(b.of("j", t0 + Duration(605000) + kHealthReportGrace - Duration(1)).size() == 1);
  CHECK(b.of("j", t0 + Duration(605000) + kHealthReportGrace).empty());
}

TEST_CASE("the board is bounded per job and in all, the entry due first making room", "[health]") {
  HealthBoard b;
  TimePoint t0{};
  // Per job: the entry that expires first goes.
  for (std::size_t i = 0; i < kMaxUnhealthyPerJob; ++i) {
    b.report(failing("j", "n_" + std::to_string(i), 10000 + static_cast<long long>(i)), t0);
  }
  b.report(failing("j", "n_new", 50000), t0);
  auto shown = b.of("j", t0);
  CHECK(shown.size() == kMaxUnhealthyPerJob);
  bool first_gone = true, newest_there = false;
  for (const auto& e : shown) {
    first_gone = first_gone && e.report.node != "n_0";
    newest_there = newest_there || e.report.node == "n_new";
  }
  CHECK(first_gone);
  CHECK(newest_there);
  // In all: many jobs of one node each.
  HealthBoard all;
  for (std::size_t i = 0; i < kMaxHealthEntries + 10; ++i) {
    all.report(failing("job" + std::to_string(i), "n_x", static_cast<long long>(i)), t0);
  }
  CHECK(all.entries() == kMaxHealthEntries);
  CHECK(all.jobs() == kMaxHealthEntries);
  CHECK(all.of("job0", t0).empty());  // due first, gone first
  CHECK(all.of("job" + std::to_string(kMaxHealthEntries + 9), t0).size() == 1);
}
