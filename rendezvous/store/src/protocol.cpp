#include <cstring>
#include <span>

#include "muster/store/protocol.hpp"

namespace muster::store {
namespace {

// Tags by dialect. 1.13 knows 0-8; its successors without VALIDATE (2.0/2.1)
// added 9-12 in the same numbering.
constexpr std::size_t kTorch113Queries = 9;
constexpr Op kBeforeValidate[] = {Op::set,       Op::compare_set, Op::get,       Op::add,      Op::check,
                          Op::wait,      Op::num_keys,    Op::watch_key, Op::delete_key, Op::append,
                          Op::multi_get, Op::multi_set,   Op::cancel_wait};
constexpr Op kV2[] = {Op::validate,   Op::set,        Op::compare_set, Op::get,        Op::add,
                      Op::check,      Op::wait,       Op::num_keys,    Op::delete_key, Op::append,
                      Op::multi_get,  Op::multi_set,  Op::cancel_wait, Op::ping,       Op::queue_push,
                      Op::queue_pop,  Op::queue_len,  Op::list_keys,   Op::barrier};

enum class Field { u32, key, value, i64 };

// The fixed fields of each query, before any list.
constexpr Field kU32[] = {Field::u32};
constexpr Field kKeyValue[] = {Field::key, Field::value};
constexpr Field kKeyTwoValues[] = {Field::key, Field::value, Field::value};
constexpr Field kKey[] = {Field::key};
constexpr Field kKeyNumber[] = {Field::key, Field::i64};

std::span<const Field> fixed_fields(Op op) {
  switch (op) {
    case Op::validate:
    case Op::ping: return kU32;
    case Op::set:
    case Op::append:
    case Op::queue_push: return kKeyValue;
    case Op::compare_set: return kKeyTwoValues;
    case Op::get:
    case Op::watch_key:
    case Op::delete_key:
    case Op::queue_pop:
    case Op::queue_len: return kKey;
    case Op::add:
    case Op::barrier: return kKeyNumber;
    default: return {};
  }
}

bool has_list(Op op) { return op == Op::check || op == Op::wait || op == Op::multi_get || op == Op::multi_set; }

template <typename T>
T load(std::string_view data, std::size_t at) {
  T v;
  std::memcpy(&v, data.data() + at, sizeof v);
  return v;
}

// A u64 length and that many bytes at data[pos]: the string's size in
// bytes, 0 while incomplete; error set when over the limit.
std::size_t string_field(std::string_view data, std::size_t pos, std::size_t limit, std::string& out,
                         std::string& error) {
  if (data.size() - pos < 8) return 0;
  uint64_t len = load<uint64_t>(data, pos);
  if (len > limit) {
    error = "a string of " + std::to_string(len) + " bytes is over the limit of " + std::to_string(limit);
    return 0;
  }
  if (data.size() - pos - 8 < len) return 0;
  out.assign(data.substr(pos + 8, static_cast<std::size_t>(len)));
  return 8 + static_cast<std::size_t>(len);
}

}  // namespace

Dialect dialect_of(ServerGeneration g) {
  return g == ServerGeneration::torch_2_2 ? Dialect::with_validate : Dialect::before_validate;
}

bool server_answers(ServerGeneration g, Op op) {
  switch (g) {
    case ServerGeneration::torch_1_13: return tag_of(Dialect::before_validate, op) < kTorch113Queries;
    case ServerGeneration::torch_2_0: return tag_of(Dialect::before_validate, op) != 0xff;
    case ServerGeneration::torch_2_2: return tag_of(Dialect::with_validate, op) != 0xff;
  }
  return false;
}

std::optional<Op> op_from_tag(Dialect d, uint8_t tag) {
  if (d == Dialect::before_validate) {
    if (tag < std::size(kBeforeValidate)) return kBeforeValidate[tag];
    return std::nullopt;
  }
  if (tag < std::size(kV2)) return kV2[tag];
  return std::nullopt;
}

uint8_t tag_of(Dialect d, Op op) {
  if (d == Dialect::before_validate) {
    for (std::size_t i = 0; i < std::size(kBeforeValidate); ++i) {
      if (kBeforeValidate[i] == op) return static_cast<uint8_t>(i);
    }
    return 0xff;
  }
  for (std::size_t i = 0; i < std::size(kV2); ++i) {
    if (kV2[i] == op) return static_cast<uint8_t>(i);
  }
  return 0xff;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::validate: return "VALIDATE";
    case Op::set: return "SET";
    case Op::compare_set: return "COMPARE_SET";
    case Op::get: return "GET";
    case Op::add: return "ADD";
    case Op::check: return "CHECK";
    case Op::wait: return "WAIT";
    case Op::num_keys: return "GETNUMKEYS";
    case Op::watch_key: return "WATCH_KEY";
    case Op::delete_key: return "DELETE_KEY";
    case Op::append: return "APPEND";
    case Op::multi_get: return "MULTI_GET";
    case Op::multi_set: return "MULTI_SET";
    case Op::cancel_wait: return "CANCEL_WAIT";
    case Op::ping: return "PING";
    case Op::queue_push: return "QUEUE_PUSH";
    case Op::queue_pop: return "QUEUE_POP";
    case Op::queue_len: return "QUEUE_LEN";
    case Op::list_keys: return "LIST_KEYS";
    case Op::barrier: return "BARRIER";
  }
  return "?";
}

ParseResult RequestParser::next(std::string_view data, Request& out) {
  ParseResult result;
  std::size_t pos = 0;
  std::string error;
  auto fail = [&](const std::string& why) {
    result.status = ParseStatus::invalid;
    result.error = stage_ == Stage::tag ? why : std::string(op_name(req_.op)) + ": " + why;
    result.consumed = pos;
    return result;
  };
  auto take = [&](std::size_t n) -> bool {
    pos += n;
    total_ += n;
    return total_ <= kMaxRequestBytes;
  };
  auto too_big = [&] { return fail("the request is over the limit of " + std::to_string(kMaxRequestBytes) + " bytes"); };
  while (true) {
    switch (stage_) {
      case Stage::tag: {
        if (pos >= data.size()) break;
        auto tag = static_cast<uint8_t>(data[pos]);
        auto op = op_from_tag(dialect_, tag);
        if (!op) return fail("unknown query type " + std::to_string(tag));
        req_ = Request{};
        req_.op = *op;
        field_ = 0;
        total_ = 0;
        take(1);
        stage_ = Stage::fixed;
        continue;
      }
      case Stage::fixed: {
        auto fields = fixed_fields(req_.op);
        if (field_ >= static_cast<int>(fields.size())) {
          stage_ = has_list(req_.op) ? Stage::count : Stage::done;
          continue;
        }
        std::size_t n = 0;
        switch (fields[static_cast<std::size_t>(field_)]) {
          case Field::u32:
            if (data.size() - pos < 4) break;
            req_.u32 = load<uint32_t>(data, pos);
            n = 4;
            break;
          case Field::i64:
            if (data.size() - pos < 8) break;
            req_.number = load<int64_t>(data, pos);
            n = 8;
            break;
          case Field::key:
            n = string_field(data, pos, kMaxKeyLength, req_.keys.emplace_back(), error);
            if (n == 0) req_.keys.pop_back();
            break;
          case Field::value:
            n = string_field(data, pos, kMaxValueLength, req_.values.emplace_back(), error);
            if (n == 0) req_.values.pop_back();
            break;
        }
        if (!error.empty()) return fail(error);
        if (n == 0) break;
        if (!take(n)) return too_big();
        ++field_;
        continue;
      }
      case Stage::count: {
        if (data.size() - pos < 8) break;
        count_ = load<uint64_t>(data, pos);
        if (count_ > kMaxKeyCount) {
          return fail("a query for " + std::to_string(count_) + " keys is over the limit of " +
                      std::to_string(kMaxKeyCount));
        }
        take(8);
        // Grown as items arrive: a count alone reserves little.
        req_.keys.reserve(std::min<std::size_t>(count_, 1024));
        if (req_.op == Op::multi_set) req_.values.reserve(std::min<std::size_t>(count_, 1024));
        item_ = 0;
        item_value_ = false;
        stage_ = Stage::items;
        continue;
      }
      case Stage::items: {
        if (item_ >= count_) {
          stage_ = Stage::done;
          continue;
        }
        std::size_t n = 0;
        if (item_value_) {
          n = string_field(data, pos, kMaxValueLength, req_.values.emplace_back(), error);
          if (n == 0) req_.values.pop_back();
        } else {
          n = string_field(data, pos, kMaxKeyLength, req_.keys.emplace_back(), error);
          if (n == 0) req_.keys.pop_back();
        }
        if (!error.empty()) return fail(error);
        if (n == 0) break;
        if (!take(n)) return too_big();
        if (req_.op == Op::multi_set && !item_value_) {
          item_value_ = true;
        } else {
          item_value_ = false;
          ++item_;
        }
        continue;
      }
      case Stage::done:
        out = std::move(req_);
        req_ = Request{};
        stage_ = Stage::tag;
        total_ = 0;
        result.status = ParseStatus::complete;
        result.consumed = pos;
        return result;
    }
    break;  // out of bytes
  }
  result.status = ParseStatus::incomplete;
  result.consumed = pos;
  return result;
}

ParseResult parse_request(Dialect d, std::string_view data, Request& out) {
  RequestParser parser(d);
  auto r = parser.next(data, out);
  if (r.status == ParseStatus::incomplete) r.consumed = 0;
  return r;
}

void put_u8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void put_i64(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void put_string(std::string& out, std::string_view s) {
  put_u64(out, s.size());
  out.append(s);
}

std::string encode_request(Dialect d, const Request& r) {
  std::string out;
  put_u8(out, tag_of(d, r.op));
  switch (r.op) {
    case Op::validate:
    case Op::ping:
      put_u32(out, r.u32);
      break;
    case Op::set:
    case Op::append:
    case Op::queue_push:
      put_string(out, r.keys.at(0));
      put_string(out, r.values.at(0));
      break;
    case Op::compare_set:
      put_string(out, r.keys.at(0));
      put_string(out, r.values.at(0));
      put_string(out, r.values.at(1));
      break;
    case Op::get:
    case Op::watch_key:
    case Op::delete_key:
    case Op::queue_pop:
    case Op::queue_len:
      put_string(out, r.keys.at(0));
      break;
    case Op::add:
    case Op::barrier:
      put_string(out, r.keys.at(0));
      put_i64(out, r.number);
      break;
    case Op::check:
    case Op::wait:
    case Op::multi_get:
      put_u64(out, r.keys.size());
      for (const auto& k : r.keys) put_string(out, k);
      break;
    case Op::multi_set:
      put_i64(out, static_cast<int64_t>(r.keys.size()));
      for (std::size_t i = 0; i < r.keys.size(); ++i) {
        put_string(out, r.keys[i]);
        put_string(out, r.values.at(i));
      }
      break;
    case Op::num_keys:
    case Op::cancel_wait:
    case Op::list_keys:
      break;
  }
  return out;
}

}  // namespace muster::store
