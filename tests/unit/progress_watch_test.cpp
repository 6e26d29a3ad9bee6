#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "cli.hpp"
#include "progress_watch.hpp"
#include "muster/common/duration.hpp"

using namespace muster::launcher;
using namespace std::chrono_literals;
using Clock = ProgressWatch::Clock;

TEST_CASE("progress watch: a worker is silent once the timeout passes without progress", "[progress]") {
  ProgressWatch w(2000ms);
  auto t0 = Clock::time_point{} + 100s;
  w.start(3, t0);
  CHECK(w.silent(t0 + 1999ms).empty());
  w.progress(1, t0 + 1500ms);
  auto s = w.silent(t0 + 2000ms);
  REQUIRE(s.size() == 2);
  CHECK(s[0].local_rank == 0);
  CHECK(s[0].silent_for == 2000ms);
  CHECK(s[1].local_rank == 2);
  s = w.silent(t0 + 3600ms);
  REQUIRE(s.size() == 3);
  CHECK(s[1].local_rank == 1);
  CHECK(s[1].silent_for == 2100ms);
}

TEST_CASE("progress watch: exited workers and stray ranks are not watched", "[progress]") {
  ProgressWatch w(1000ms);
  auto t0 = Clock::time_point{} + 5s;
  w.start(2, t0);
  w.stop(0);
  w.progress(0, t0 + 5s);    // an exited worker's late output does not bring it back
  w.progress(7, t0 + 5s);    // no such rank
  w.progress(-1, t0 + 5s);
  w.progress(1, t0 - 1s);    // the past does not move it back
  auto s = w.silent(t0 + 1s);
  REQUIRE(s.size() == 1);
  CHECK(s[0].local_rank == 1);
  w.clear();
  CHECK(w.silent(t0 + 60s).empty());
}

TEST_CASE("progress watch: a worker held on a full console is not silent", "[progress]") {
  ProgressWatch w(1000ms);
  auto t0 = Clock::time_point{} + 5s;
  w.start(2, t0);
  w.hold(0, true, t0 + 100ms);
  w.hold(0, true, t0 + 100ms);  // both streams
  auto s = w.silent(t0 + 10s);
  REQUIRE(s.size() == 1);
  CHECK(s[0].local_rank == 1);
  w.hold(0, false, t0 + 10s);
  CHECK(w.silent(t0 + 12s).size() == 1);  // still held by the other stream
  w.hold(0, false, t0 + 12s);  // released: counted from here
  CHECK(w.silent(t0 + 12500ms).size() == 1);
  CHECK(w.silent(t0 + 13s).size() == 2);
  w.progress_all(t0 + 20s);
  CHECK(w.silent(t0 + 20500ms).empty());
}

TEST_CASE("progress watch: checks a tenth of the timeout, within bounds", "[progress]") {
  CHECK(ProgressWatch(100ms).check_interval() == kMinProgressCheck);
  CHECK(ProgressWatch(3000ms).check_interval() == 300ms);
  CHECK(ProgressWatch(600000ms).check_interval() == kMaxProgressCheck);
}

TEST_CASE("worker timeout values", "[progress]") {
  CHECK(parse_worker_timeout("600") == std::chrono::milliseconds(600000));
  CHECK(parse_worker_timeout(" 2.5 ") == std::chrono::milliseconds(2500));
  CHECK(parse_worker_timeout("0") == std::chrono::milliseconds(0));
  CHECK(parse_worker_timeout("0.1") == std::chrono::milliseconds(100));
  CHECK_FALSE(parse_worker_timeout("0.05"));
  CHECK_FALSE(parse_worker_timeout("-1"));
  CHECK_FALSE(parse_worker_timeout("ten"));
  CHECK_FALSE(parse_worker_timeout("nan"));
  CHECK_FALSE(parse_worker_timeout("inf"));
  CHECK_FALSE(parse_worker_timeout("1e12"));
  CHECK_FALSE(parse_worker_timeout(""));
}

TEST_CASE("/proc/net/tcp rows", "[progress]") {
  const char* text =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      "   0: 0100007F:9C40 0100007F:7530 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 20 4 30 10 -1\n"
      "   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 "
      "00:00000000 00000000     0        0 77 1 0 100 0 0 10 0\n"
      "   2: garbage\n"
      "   3: 0100007F:ZZZZ 0100007F:7530 01 00000000:00000000 00:00000000 00000000     0        0 9 1\n";
  auto rows = parse_proc_net_tcp(text);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].local_port == 40000);
  CHECK(rows[0].remote_port == 30000);
  CHECK(rows[0].inode == 4242);
  CHECK(rows[1].local_port == 8080);
  CHECK(rows[1].remote_port == 0);
  CHECK(rows[1].inode == 77);
}

TEST_CASE("the owner of a local socket is found through the process's descriptors", "[progress]") {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/muster-proc-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  fs::path root(tmpl);
  fs::create_directories(root / "net");
  std::ofstream(root / "net" / "tcp")
      << "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      << "   0: 0100007F:9C40 0100007F:7530 01 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
      << "   1: 0100007F:9C41 0100007F:7530 01 00000000:00000000 00:00000000 00000000     0        0 4343 1\n";
  std::ofstream(root / "net" / "tcp6") << "  sl  local_address rem_address\n";
  for (auto [pid, inode] : {std::pair{101, 1000}, std::pair{202, 4343}}) {
    fs::create_directories(root / std::to_string(pid) / "fd");
    fs::create_symlink("pipe:[5]", root / std::to_string(pid) / "fd" / "1");
    fs::create_symlink("socket:[" + std::to_string(inode) + "]", root / std::to_string(pid) / "fd" / "3");
  }
  std::vector<std::pair<int, pid_t>> workers = {{0, 101}, {1, 202}, {2, 0}};
  auto root_text = root.string();
  fs::path cleanup = root;
  struct Remove {
    fs::path p;
    ~Remove() { fs::remove_all(p); }
  } remove{cleanup};
  CHECK(local_socket_owners({40001, 40000}, 30000, workers, root_text) == std::map<int, int>{{40001, 1}});
  CHECK(local_socket_owners({40000}, 30000, workers, root_text).empty());  // 4242 is nobody's here
  CHECK(local_socket_owners({40001}, 29999, workers, root_text).empty());  // another peer
  CHECK(local_socket_owners({40001}, 30000, {{0, 101}}, root_text).empty());
}

TEST_CASE("durations as the agent says them", "[progress]") {
  CHECK(muster::seconds_text(3000ms) == "3 s");
  CHECK(muster::seconds_text(2500ms) == "2.5 s");
  CHECK(muster::seconds_text(250ms) == "0.25 s");
  CHECK(muster::seconds_text(1234ms) == "1.234 s");
  CHECK(muster::seconds_text(0ms) == "0 s");
  CHECK(muster::seconds_text(-1500ms) == "-1.5 s");
}
