#include <cstring>

#include "muster/store/protocol.hpp"

namespace muster::store {
namespace {

// Tags by dialect. 1.13 knows 0-8; its successors without VALIDATE (2.0/2.1)
// added 9-12 in the same numbering, which the legacy dialect accepts too.
constexpr Op kLegacy[] = {Op::set,       Op::compare_set, Op::get,       Op::add,      Op::check,
                          Op::wait,      Op::num_keys,    Op::watch_key, Op::delete_key, Op::append,
                          Op::multi_get, Op::multi_set,   Op::cancel_wait};
constexpr Op kV2[] = {Op::validate,   Op::set,        Op::compare_set, Op::get,        Op::add,
                      Op::check,      Op::wait,       Op::num_keys,    Op::delete_key, Op::append,
                      Op::multi_get,  Op::multi_set,  Op::cancel_wait, Op::ping,       Op::queue_push,
                      Op::queue_pop,  Op::queue_len,  Op::list_keys,   Op::barrier};

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool u8(uint8_t& v) { return raw(&v, 1); }
  bool u32(uint32_t& v) { return raw(&v, 4); }
  bool u64(uint64_t& v) { return raw(&v, 8); }
  bool i64(int64_t& v) { return raw(&v, 8); }
  // false with error set when the length is over the limit.
  bool string(std::string& s, std::size_t limit, std::string& error) {
    uint64_t len = 0;
    std::size_t save = pos_;
    if (!u64(len)) return false;
    if (len > limit) {
      error = "a string of " + std::to_string(len) + " bytes is over the limit of " + std::to_string(limit);
      pos_ = save;
      return false;
    }
    if (data_.size() - pos_ < len) {
      pos_ = save;
      return false;
    }
    s.assign(data_.substr(pos_, static_cast<std::size_t>(len)));
    pos_ += static_cast<std::size_t>(len);
    return true;
  }
  std::size_t pos() const { return pos_; }

 private:
  bool raw(void* out, std::size_t n) {
    if (data_.size() - pos_ < n) return false;
    std::memcpy(out, data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view data_;
  std::size_t pos_ = 0;
};

}  // namespace

std::optional<Op> op_from_tag(Dialect d, uint8_t tag) {
  if (d == Dialect::v1_13) {
    if (tag < std::size(kLegacy)) return kLegacy[tag];
    return std::nullopt;
  }
  if (tag < std::size(kV2)) return kV2[tag];
  return std::nullopt;
}

uint8_t tag_of(Dialect d, Op op) {
  if (d == Dialect::v1_13) {
    for (std::size_t i = 0; i < std::size(kLegacy); ++i) {
      if (kLegacy[i] == op) return static_cast<uint8_t>(i);
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

ParseResult parse_request(Dialect d, std::string_view data, Request& out) {
  ParseResult result;
  Reader r(data);
  uint8_t tag = 0;
  if (!r.u8(tag)) return result;
  auto op = op_from_tag(d, tag);
  if (!op) {
    result.status = ParseStatus::invalid;
    result.error = "unknown query type " + std::to_string(tag);
    return result;
  }
  out = Request{};
  out.op = *op;
  std::string error;
  auto key = [&](std::string& k) { return r.string(k, kMaxKeyLength, error); };
  auto value = [&](std::string& v) { return r.string(v, kMaxValueLength, error); };
  bool ok = true;
  switch (*op) {
    case Op::validate:
    case Op::ping:
      ok = r.u32(out.u32);
      break;
    case Op::set:
    case Op::append:
    case Op::queue_push:
      out.keys.resize(1);
      out.values.resize(1);
      ok = key(out.keys[0]) && value(out.values[0]);
      break;
    case Op::compare_set:
      out.keys.resize(1);
      out.values.resize(2);
      ok = key(out.keys[0]) && value(out.values[0]) && value(out.values[1]);
      break;
    case Op::get:
    case Op::watch_key:
    case Op::delete_key:
    case Op::queue_pop:
    case Op::queue_len:
      out.keys.resize(1);
      ok = key(out.keys[0]);
      break;
    case Op::add:
    case Op::barrier:
      out.keys.resize(1);
      ok = key(out.keys[0]) && r.i64(out.number);
      break;
    case Op::check:
    case Op::wait:
    case Op::multi_get: {
      uint64_t n = 0;
      ok = r.u64(n);
      if (ok && n > kMaxKeyCount) {
        error = "a query for " + std::to_string(n) + " keys is over the limit of " + std::to_string(kMaxKeyCount);
        ok = false;
        break;
      }
      if (ok) out.keys.resize(static_cast<std::size_t>(n));
      for (std::size_t i = 0; ok && i < out.keys.size(); ++i) ok = key(out.keys[i]);
      break;
    }
    case Op::multi_set: {
      uint64_t n = 0;
      ok = r.u64(n);
      if (ok && n > kMaxKeyCount) {
        error = "a query for " + std::to_string(n) + " keys is over the limit of " + std::to_string(kMaxKeyCount);
        ok = false;
        break;
      }
      if (ok) {
        out.keys.resize(static_cast<std::size_t>(n));
        out.values.resize(static_cast<std::size_t>(n));
      }
      for (std::size_t i = 0; ok && i < out.keys.size(); ++i) ok = key(out.keys[i]) && value(out.values[i]);
      break;
    }
    case Op::num_keys:
    case Op::cancel_wait:
    case Op::list_keys:
      break;
  }
  if (!ok) {
    if (!error.empty()) {
      result.status = ParseStatus::invalid;
      result.error = std::string(op_name(*op)) + ": " + error;
    }
    return result;  // incomplete
  }
  result.status = ParseStatus::complete;
  result.consumed = r.pos();
  return result;
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
