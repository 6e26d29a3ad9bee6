#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "line_splitter.hpp"

using namespace muster::launcher;

namespace {

struct Collector {
  std::vector<std::pair<std::string, bool>> lines;
  LineSplitter::Sink sink() {
    return [this](std::string_view l, bool complete) { lines.emplace_back(std::string(l), complete); };
  }
};

}  // namespace

TEST_CASE("lines split across reads are joined", "[lines]") {
  LineSplitter s;
  Collector c;
  s.feed("hel", c.sink());
  CHECK(c.lines.empty());
  s.feed("lo\nwor", c.sink());
  s.feed("ld\n\nx", c.sink());
  REQUIRE(c.lines.size() == 3);
  CHECK(c.lines[0] == std::make_pair(std::string("hello"), true));
  CHECK(c.lines[1] == std::make_pair(std::string("world"), true));
  CHECK(c.lines[2] == std::make_pair(std::string(""), true));
  s.finish(c.sink());
  REQUIRE(c.lines.size() == 4);
  CHECK(c.lines[3] == std::make_pair(std::string("x"), false));
}

TEST_CASE("a line without end is handed on in bounded pieces", "[lines]") {
  LineSplitter s(4);
  Collector c;
  s.feed("abcdefghij", c.sink());
  REQUIRE(c.lines.size() == 2);
  CHECK(c.lines[0].first == "abcd");
  CHECK_FALSE(c.lines[0].second);
  CHECK(c.lines[1].first == "efgh");
  CHECK(s.buffered() == 2);
  s.feed("\n", c.sink());
  CHECK(c.lines.back() == std::make_pair(std::string("ij"), true));
}

TEST_CASE("finish with nothing pending emits nothing", "[lines]") {
  LineSplitter s;
  Collector c;
  s.feed("a\n", c.sink());
  s.finish(c.sink());
  CHECK(c.lines.size() == 1);
}
