#include <catch2/catch.hpp>

#include "muster/store/protocol.hpp"

using namespace muster::store;

TEST_CASE("the two dialects number their queries differently", "[protocol]") {
  CHECK(*op_from_tag(Dialect::before_validate, 0) == Op::set);
  CHECK(*op_from_tag(Dialect::before_validate, 5) == Op::wait);
  CHECK(*op_from_tag(Dialect::before_validate, 7) == Op::watch_key);
  CHECK(*op_from_tag(Dialect::with_validate, 0) == Op::validate);
  CHECK(*op_from_tag(Dialect::with_validate, 6) == Op::wait);
  CHECK(*op_from_tag(Dialect::with_validate, 8) == Op::delete_key);
  CHECK(*op_from_tag(Dialect::with_validate, 13) == Op::ping);
  CHECK(*op_from_tag(Dialect::with_validate, 18) == Op::barrier);
  CHECK_FALSE(op_from_tag(Dialect::with_validate, 19));
  CHECK_FALSE(op_from_tag(Dialect::before_validate, 13));
}

TEST_CASE("captured 1.13 bytes parse", "[protocol]") {
  // ADD "init/" +1, as a real 1.13 client sends it.
  std::string add = std::string("\x03\x05\0\0\0\0\0\0\0init/\x01\0\0\0\0\0\0\0", 22);
  Request r;
  auto p = parse_request(Dialect::before_validate, add, r);
  REQUIRE(p.status == ParseStatus::complete);
  CHECK(p.consumed == 22);
  CHECK(r.op == Op::add);
  CHECK(r.keys[0] == "init/");
  CHECK(r.number == 1);
}

TEST_CASE("a request split anywhere is incomplete until its last byte", "[protocol]") {
  for (Dialect d : {Dialect::before_validate, Dialect::with_validate}) {
    Request in;
    in.op = Op::multi_set;
    in.keys = {"/a", "/bb"};
    in.values = {"1", std::string(300, 'z')};
    if (tag_of(d, in.op) == 0xff) continue;
    std::string bytes = encode_request(d, in);
    for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
      Request out;
      CHECK(parse_request(d, std::string_view(bytes).substr(0, cut), out).status == ParseStatus::incomplete);
    }
    Request out;
    auto p = parse_request(d, bytes + "extra", out);
    REQUIRE(p.status == ParseStatus::complete);
    CHECK(p.consumed == bytes.size());
    CHECK(out.keys == in.keys);
    CHECK(out.values == in.values);
  }
}

TEST_CASE("unknown tags and oversized lengths are invalid, not allocated", "[protocol]") {
  Request r;
  CHECK(parse_request(Dialect::with_validate, std::string(1, '\x40'), r).status == ParseStatus::invalid);
  std::string huge = std::string(1, '\x03');  // v2 GET
  put_u64(huge, 1ULL << 40);
  CHECK(parse_request(Dialect::with_validate, huge, r).status == ParseStatus::invalid);
  std::string many = std::string(1, '\x06');  // v2 WAIT
  put_u64(many, 1ULL << 30);
  CHECK(parse_request(Dialect::with_validate, many, r).status == ParseStatus::invalid);
}

TEST_CASE("the incremental parser gives the same requests however the stream is cut", "[protocol][hardening]") {
  Request a;
  a.op = Op::multi_set;
  a.keys = {"k1", "key-two", ""};
  a.values = {"v1", std::string(1000, 'x'), "v3"};
  Request b;
  b.op = Op::wait;
  b.keys = {"x", "y"};
  Request c;
  c.op = Op::add;
  c.keys = {"n"};
  c.number = -5;
  std::string stream = encode_request(Dialect::with_validate, a) + encode_request(Dialect::with_validate, b) + encode_request(Dialect::with_validate, c);
  for (std::size_t cut : {1, 3, 7, 64, 4096}) {
    RequestParser parser(Dialect::with_validate);
    std::vector<Request> got;
    std::string buffer;
    std::size_t pos = 0;
    for (std::size_t i = 0; i < stream.size(); i += cut) {
      buffer += stream.substr(i, cut);
      while (pos < buffer.size()) {
        Request r;
        auto res = parser.next(std::string_view(buffer).substr(pos), r);
        REQUIRE(res.status != ParseStatus::invalid);
        pos += res.consumed;
        if (res.status == ParseStatus::incomplete) break;
        got.push_back(r);
      }
    }
    REQUIRE(got.size() == 3);
    CHECK(got[0].keys == a.keys);
    CHECK(got[0].values == a.values);
    CHECK(got[1].keys == b.keys);
    CHECK(got[2].number == -5);
    CHECK(pos == stream.size());
  }
}

TEST_CASE("a key count over the limit is refused before anything is read", "[protocol][hardening]") {
  std::string bytes;
  put_u8(bytes, tag_of(Dialect::with_validate, Op::wait));
  put_u64(bytes, kMaxKeyCount + 1);
  Request r;
  auto res = parse_request(Dialect::with_validate, bytes, r);
  CHECK(res.status == ParseStatus::invalid);
  CHECK(res.error.find("over the limit") != std::string::npos);
}

TEST_CASE("which queries each server generation answers", "[store]") {
  using muster::store::ServerGeneration;
  CHECK(dialect_of(ServerGeneration::torch_1_13) == Dialect::before_validate);
  CHECK(dialect_of(ServerGeneration::torch_2_0) == Dialect::before_validate);
  CHECK(dialect_of(ServerGeneration::torch_2_2) == Dialect::with_validate);
  // 1.13: SET to DELETE_KEY, WATCH_KEY among them; none of what 2.0 added.
  for (Op op : {Op::set, Op::compare_set, Op::get, Op::add, Op::check, Op::wait, Op::num_keys, Op::watch_key,
                Op::delete_key}) {
    CHECK(server_answers(ServerGeneration::torch_1_13, op));
  }
  for (Op op : {Op::append, Op::multi_get, Op::multi_set, Op::cancel_wait, Op::validate, Op::ping}) {
    CHECK_FALSE(server_answers(ServerGeneration::torch_1_13, op));
  }
  CHECK(server_answers(ServerGeneration::torch_2_0, Op::append));
  CHECK(server_answers(ServerGeneration::torch_2_0, Op::cancel_wait));
  CHECK_FALSE(server_answers(ServerGeneration::torch_2_0, Op::ping));
  CHECK(server_answers(ServerGeneration::torch_2_2, Op::ping));
  CHECK(server_answers(ServerGeneration::torch_2_2, Op::barrier));
  CHECK_FALSE(server_answers(ServerGeneration::torch_2_2, Op::watch_key));
}
