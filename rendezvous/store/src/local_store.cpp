#include "muster/store/local_store.hpp"

#include <cstring>

namespace muster::store {
namespace {

// Reads the fields of a reply in order, as a client reads them off a socket.
class ReplyReader {
 public:
  explicit ReplyReader(std::string_view bytes) : bytes_(bytes) {}
  Result<uint8_t> u8() {
    if (bytes_.size() - at_ < 1) return short_reply();
    return static_cast<uint8_t>(bytes_[at_++]);
  }
  Result<int64_t> i64() {
    if (bytes_.size() - at_ < 8) return short_reply();
    int64_t v = 0;
    std::memcpy(&v, bytes_.data() + at_, 8);
    at_ += 8;
    return v;
  }
  Result<std::string> string() {
    auto len = i64();
    if (!len.ok()) return len.status();
    auto n = static_cast<uint64_t>(len.value());
    if (bytes_.size() - at_ < n) return short_reply();
    std::string s(bytes_.substr(at_, static_cast<std::size_t>(n)));
    at_ += static_cast<std::size_t>(n);
    return s;
  }

 private:
  static Status short_reply() { return Status(Code::internal, "the local store gave a short reply"); }
  std::string_view bytes_;
  std::size_t at_ = 0;
};

// Requests the state answers at once, later (a wait), or never.
bool answered(Op op) { return op != Op::set && op != Op::append && op != Op::multi_set; }

Request request(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {}) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

}  // namespace

Result<std::string> LocalStore::run(Request req, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const ConnId conn = next_conn_++;
  std::vector<Reply> out;
  std::string error;
  if (!state_.handle(conn, req, out, error)) {
    state_.disconnect(conn);
    return invalid_argument(std::string(op_name(req.op)) + ": " + error);
  }
  bool others = false;
  for (auto& r : out) {
    mailbox_[r.conn] += r.bytes;
    others = others || r.conn != conn;
  }
  if (others) arrived_.notify_all();
  std::string bytes;
  if (answered(req.op)) {
    if (!arrived_.wait_for(lock, timeout, [&] { return mailbox_.count(conn) > 0; })) {
      state_.disconnect(conn);  // drops the wait: no reply can come for it now
      std::string keys;
      for (const auto& k : req.keys) keys += " '" + k + "'";
      return Status(Code::timeout, std::string(op_name(req.op)) + " timed out after " +
                                       std::to_string(timeout.count()) + " ms for the key(s)" + keys);
    }
    bytes = std::move(mailbox_[conn]);
    mailbox_.erase(conn);
  }
  state_.disconnect(conn);
  return bytes;
}

std::size_t LocalStore::pending_waits() {
  std::lock_guard lock(mutex_);
  return state_.pending_waits();
}

Status LocalStore::set(const std::string& key, std::string_view value) {
  return run(request(Op::set, {key}, {std::string(value)})).status();
}

Result<std::string> LocalStore::get(const std::string& key) {
  if (auto st = wait({key}); !st.ok()) return st;
  auto bytes = run(request(Op::get, {key}));
  if (!bytes.ok()) return bytes.status();
  return ReplyReader(bytes.value()).string();
}

Result<int64_t> LocalStore::add(const std::string& key, int64_t delta) {
  Request r = request(Op::add, {key});
  r.number = delta;
  auto bytes = run(std::move(r));
  if (!bytes.ok()) return bytes.status();
  return ReplyReader(bytes.value()).i64();
}

Result<std::string> LocalStore::compare_set(const std::string& key, std::string_view expected,
                                            std::string_view desired) {
  auto bytes = run(request(Op::compare_set, {key}, {std::string(expected), std::string(desired)}));
  if (!bytes.ok()) return bytes.status();
  return ReplyReader(bytes.value()).string();
}

Result<bool> LocalStore::check(const std::vector<std::string>& keys) {
  auto bytes = run(request(Op::check, keys));
  if (!bytes.ok()) return bytes.status();
  auto v = ReplyReader(bytes.value()).u8();
  if (!v.ok()) return v.status();
  return v.value() == kReady;
}

Status LocalStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return run(request(Op::wait, keys), timeout).status();
}

Result<int64_t> LocalStore::num_keys() {
  auto bytes = run(request(Op::num_keys));
  if (!bytes.ok()) return bytes.status();
  return ReplyReader(bytes.value()).i64();
}

Result<bool> LocalStore::delete_key(const std::string& key) {
  auto bytes = run(request(Op::delete_key, {key}));
  if (!bytes.ok()) return bytes.status();
  auto v = ReplyReader(bytes.value()).i64();
  if (!v.ok()) return v.status();
  return v.value() == 1;
}

Status LocalStore::append(const std::string& key, std::string_view value) {
  return run(request(Op::append, {key}, {std::string(value)})).status();
}

Result<std::vector<std::string>> LocalStore::multi_get(const std::vector<std::string>& keys) {
  if (auto st = wait(keys); !st.ok()) return st;
  auto bytes = run(request(Op::multi_get, keys));
  if (!bytes.ok()) return bytes.status();
  ReplyReader reader(bytes.value());
  std::vector<std::string> values;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto v = reader.string();
    if (!v.ok()) return v.status();
    values.push_back(std::move(v.value()));
  }
  return values;
}

Status LocalStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) return invalid_argument("multi_set needs as many values as keys");
  return run(request(Op::multi_set, keys, values)).status();
}

}  // namespace muster::store
