#include "muster/store/state.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string_view>
#include <unordered_set>

namespace muster::store {
namespace {

std::string byte(uint8_t v) { return std::string(1, static_cast<char>(v)); }

// std::stoll's reading of a counter: leading blanks, a sign, digits; the rest
// ignored. nullopt when there are no digits or the number does not fit.
std::optional<int64_t> parse_counter(const std::string& s) {
  const char* p = s.c_str();
  while (std::isspace(static_cast<unsigned char>(*p))) ++p;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(p, &end, 10);
  if (end == p || errno == ERANGE) return std::nullopt;
  return v;
}

// Two's-complement addition, as PyTorch's server does it: counters wrap.
int64_t wrapping_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

}  // namespace

bool StoreState::exists(const std::string& key) const {
  if (data_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

std::size_t StoreState::pending_waits() const {
  std::size_t n = 0;
  for (const auto& [conn, list] : waiters_by_conn_) n += list.size();
  return n;
}

void StoreState::forget_waiter(const WaiterPtr& w) {
  for (auto& reg : w->registrations) {
    if (!reg.active) continue;
    reg.active = false;
    auto it = waiters_by_key_.find(*reg.key);
    if (it == waiters_by_key_.end()) continue;
    it->second.erase(reg.at);
    if (it->second.empty()) waiters_by_key_.erase(it);
  }
  auto c = waiters_by_conn_.find(w->conn);
  if (c != waiters_by_conn_.end()) {
    c->second.erase(w->in_conn);
    if (c->second.empty()) waiters_by_conn_.erase(c);
  }
  if (auto k = waited_keys_of_.find(w->conn); k != waited_keys_of_.end()) {
    k->second -= std::min(k->second, w->registrations.size());
    if (k->second == 0) waited_keys_of_.erase(k);
  }
}

// One registration of w is satisfied; the last one answers the connection.
void StoreState::count_down(const WaiterPtr& w, std::size_t registration, std::vector<Reply>& out) {
  w->registrations[registration].active = false;
  if (--w->remaining > 0) return;
  out.push_back({w->conn, byte(kStopWaiting)});
  forget_waiter(w);
}

// Every waiter registered on key counts it once.
void StoreState::changed(const std::string& key, std::vector<Reply>& out) {
  auto it = waiters_by_key_.find(key);
  if (it == waiters_by_key_.end()) return;
  KeyWaiters list = std::move(it->second);
  waiters_by_key_.erase(it);
  for (const auto& [w, reg] : list) count_down(w, reg, out);
}

void StoreState::notify_watchers(const std::string& key, uint8_t kind, const std::string& old_value,
                                 const std::string& new_value, std::vector<Reply>& out) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  std::string msg;
  put_u8(msg, kind);
  put_string(msg, key);
  put_string(msg, old_value);
  put_string(msg, new_value);
  for (ConnId c : it->second) out.push_back({c, msg});
}

void StoreState::register_wait(ConnId conn, const std::vector<const std::string*>& missing) {
  auto w = std::make_shared<Waiter>();
  w->conn = conn;
  w->remaining = missing.size();
  w->registrations.resize(missing.size());
  for (std::size_t i = 0; i < missing.size(); ++i) {
    auto [slot, inserted] = waiters_by_key_.try_emplace(*missing[i]);
    auto& reg = w->registrations[i];
    reg.key = &slot->first;
    reg.at = slot->second.insert(slot->second.end(), {w, i});
    reg.active = true;
  }
  auto& mine = waiters_by_conn_[conn];
  w->in_conn = mine.insert(mine.end(), w);
  waited_keys_of_[conn] += missing.size();
}

void StoreState::cancel_waits(ConnId conn) {
  auto it = waiters_by_conn_.find(conn);
  if (it == waiters_by_conn_.end()) return;
  std::vector<WaiterPtr> list(it->second.begin(), it->second.end());
  for (const auto& w : list) forget_waiter(w);
}

void StoreState::disconnect(ConnId conn) {
  cancel_waits(conn);
  waited_keys_of_.erase(conn);
  if (watches_of_.erase(conn) == 0) return;
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    auto& list = it->second;
    list.erase(std::remove(list.begin(), list.end(), conn), list.end());
    it = list.empty() ? watchers_.erase(it) : std::next(it);
  }
}

void StoreState::clear() {
  data_.clear();
  queues_.clear();
  waiters_by_key_.clear();
  waiters_by_conn_.clear();
  watchers_.clear();
  watches_of_.clear();
  waited_keys_of_.clear();
}

void StoreState::store_value(const std::string& key, std::string value, std::vector<Reply>& out) {
  auto [it, created] = data_.try_emplace(key);
  std::string old = created || watchers_.empty() ? std::string() : std::move(it->second);
  it->second = std::move(value);
  if (!watchers_.empty()) notify_watchers(key, created ? kKeyCreated : kKeyUpdated, old, it->second, out);
  changed(key, out);
}

bool StoreState::on_compare_set(ConnId conn, const Request& req, Out& out, std::string&) {
  const std::string& key = req.keys[0];
  const std::string& expected = req.values[0];
  const std::string& desired = req.values[1];
  std::string r;
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (expected.empty()) {
      store_value(key, desired, out);
      put_string(r, desired);
    } else {
      put_string(r, expected);  // PyTorch's servers answer with `expected` here
    }
  } else if (it->second == expected) {
    store_value(key, desired, out);
    put_string(r, desired);
  } else {
    put_string(r, it->second);
  }
  out.push_back({conn, std::move(r)});
  return true;
}

// The counter at key plus delta (a missing key counts as 0); nullopt with
// error set when the key holds something that is not a number.
std::optional<int64_t> StoreState::counter_plus(const std::string& key, int64_t delta, const char* op,
                                                std::string& error) const {
  auto it = data_.find(key);
  if (it == data_.end()) return delta;
  auto old = parse_counter(it->second);
  if (!old) {
    error = std::string(op) + " on the key '" + key.substr(0, 200) + "', whose value is not a number";
    return std::nullopt;
  }
  return wrapping_add(*old, delta);
}

bool StoreState::on_add(ConnId conn, const Request& req, Out& out, std::string& error) {
  const std::string& key = req.keys[0];
  auto sum = counter_plus(key, req.number, "ADD", error);
  if (!sum) return false;
  int64_t value = *sum;
  store_value(key, std::to_string(value), out);
  std::string r;
  put_i64(r, value);
  out.push_back({conn, std::move(r)});
  return true;
}

// O(keys): duplicates are dropped through a hash set, and each missing key
// costs one registration.
bool StoreState::on_wait(ConnId conn, const Request& req, Out& out, std::string& error) {
  std::vector<const std::string*> missing;
  std::unordered_set<std::string_view> seen;
  for (const auto& k : req.keys) {
    if (exists(k)) continue;
    if (seen.insert(k).second) missing.push_back(&k);
  }
  if (missing.empty()) {
    out.push_back({conn, byte(kStopWaiting)});
    return true;
  }
  auto held = waited_keys_of_.find(conn);
  if ((held == waited_keys_of_.end() ? 0 : held->second) + missing.size() > kMaxWaitedKeysPerConnection) {
    error = "WAIT: this connection would wait on more than " + std::to_string(kMaxWaitedKeysPerConnection) +
            " keys at once";
    return false;
  }
  register_wait(conn, missing);
  return true;
}

bool StoreState::on_multi_get(ConnId conn, const Request& req, Out& out, std::string& error) {
  std::size_t bytes = 0;
  for (const auto& k : req.keys) {
    auto it = data_.find(k);
    bytes += 8 + (it == data_.end() ? 0 : it->second.size());
    if (bytes > kMaxReplyBytes) {
      error = "MULTI_GET: the reply would be over the limit of " + std::to_string(kMaxReplyBytes) + " bytes";
      return false;
    }
  }
  std::string r;
  r.reserve(bytes);
  for (const auto& k : req.keys) {
    auto it = data_.find(k);
    put_string(r, it == data_.end() ? std::string() : it->second);
  }
  out.push_back({conn, std::move(r)});
  return true;
}

bool StoreState::on_watch(ConnId conn, const Request& req, Out& out, std::string& error) {
  auto& list = watchers_[req.keys[0]];
  if (std::find(list.begin(), list.end(), conn) == list.end()) {
    auto& mine = watches_of_[conn];
    if (mine >= kMaxWatchesPerConnection) {
      if (list.empty()) watchers_.erase(req.keys[0]);
      error = "WATCH_KEY: this connection watches " + std::to_string(mine) + " keys, the limit";
      return false;
    }
    ++mine;
    list.push_back(conn);
  }
  out.push_back({conn, byte(kWatchRegistered)});
  return true;
}

bool StoreState::on_delete(ConnId conn, const Request& req, Out& out, std::string&) {
  auto it = data_.find(req.keys[0]);
  int64_t n = 0;
  if (it != data_.end()) {
    std::string old = std::move(it->second);
    data_.erase(it);
    n = 1;
    if (!watchers_.empty()) notify_watchers(req.keys[0], kKeyDeleted, old, std::string(), out);
  }
  std::string r;
  put_i64(r, n);
  out.push_back({conn, std::move(r)});
  return true;
}

// A push satisfies one waiter on the queue's name, the one waiting longest.
bool StoreState::on_queue_push(ConnId, const Request& req, Out& out, std::string&) {
  const std::string& name = req.keys[0];
  queues_[name].push_back(req.values[0]);
  auto it = waiters_by_key_.find(name);
  if (it == waiters_by_key_.end() || it->second.empty()) return true;
  auto [w, reg] = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) waiters_by_key_.erase(it);
  count_down(w, reg, out);
  return true;
}

bool StoreState::on_queue_pop(ConnId conn, const Request& req, Out& out, std::string&) {
  std::string r;
  auto it = queues_.find(req.keys[0]);
  int64_t len = it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
  put_i64(r, len);
  if (len > 0) {
    put_string(r, it->second.front());
    it->second.pop_front();
    if (it->second.empty()) queues_.erase(it);
  }
  out.push_back({conn, std::move(r)});
  return true;
}

bool StoreState::on_barrier(ConnId conn, const Request& req, Out& out, std::string& error) {
  const std::string& key = req.keys[0];
  auto arrived = counter_plus(key, 1, "BARRIER", error);
  if (!arrived) return false;
  int64_t count = *arrived;
  data_[key] = std::to_string(count);
  if (count >= req.number) {
    changed(key, out);
    out.push_back({conn, byte(kStopWaiting)});
  } else {
    auto held = waited_keys_of_.find(conn);
    if (held != waited_keys_of_.end() && held->second >= kMaxWaitedKeysPerConnection) {
      error = "BARRIER: this connection already waits on " + std::to_string(held->second) + " keys";
      return false;
    }
    register_wait(conn, {&key});
  }
  return true;
}

bool StoreState::on_validate(ConnId, const Request& req, Out&, std::string& error) {
  if (req.u32 == kValidateMagic) return true;
  error = "VALIDATE with a wrong magic number";
  return false;
}

bool StoreState::on_ping(ConnId conn, const Request& req, Out& out, std::string&) {
  std::string r;
  put_u32(r, req.u32);
  out.push_back({conn, std::move(r)});
  return true;
}

bool StoreState::on_set(ConnId, const Request& req, Out& out, std::string&) {
  store_value(req.keys[0], req.values[0], out);
  return true;
}

bool StoreState::on_get(ConnId conn, const Request& req, Out& out, std::string&) {
  std::string r;
  auto it = data_.find(req.keys[0]);
  put_string(r, it == data_.end() ? std::string() : it->second);
  out.push_back({conn, std::move(r)});
  return true;
}

bool StoreState::on_check(ConnId conn, const Request& req, Out& out, std::string&) {
  bool all = std::all_of(req.keys.begin(), req.keys.end(), [&](const std::string& k) { return exists(k); });
  out.push_back({conn, byte(all ? kReady : kNotReady)});
  return true;
}

bool StoreState::on_num_keys(ConnId conn, const Request&, Out& out, std::string&) {
  std::string r;
  put_i64(r, static_cast<int64_t>(data_.size()));
  out.push_back({conn, std::move(r)});
  return true;
}

bool StoreState::on_append(ConnId, const Request& req, Out& out, std::string&) {
  auto it = data_.find(req.keys[0]);
  std::string v = it == data_.end() ? req.values[0] : it->second + req.values[0];
  store_value(req.keys[0], std::move(v), out);
  return true;
}

bool StoreState::on_multi_set(ConnId, const Request& req, Out& out, std::string&) {
  for (std::size_t i = 0; i < req.keys.size(); ++i) store_value(req.keys[i], req.values[i], out);
  return true;
}

bool StoreState::on_cancel_wait(ConnId conn, const Request&, Out& out, std::string&) {
  cancel_waits(conn);
  out.push_back({conn, byte(kWaitCanceled)});
  return true;
}

bool StoreState::on_queue_len(ConnId conn, const Request& req, Out& out, std::string&) {
  std::string r;
  auto it = queues_.find(req.keys[0]);
  put_i64(r, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
  out.push_back({conn, std::move(r)});
  return true;
}

bool StoreState::on_list_keys(ConnId conn, const Request&, Out& out, std::string&) {
  std::string r;
  put_i64(r, static_cast<int64_t>(data_.size()));
  for (const auto& [k, v] : data_) put_string(r, k);
  out.push_back({conn, std::move(r)});
  return true;
}

bool StoreState::handle(ConnId conn, const Request& req, Out& out, std::string& error) {
  auto call = [&](Handler h) { return (this->*h)(conn, req, out, error); };
  switch (req.op) {
    case Op::validate: return call(&StoreState::on_validate);
    case Op::ping: return call(&StoreState::on_ping);
    case Op::set: return call(&StoreState::on_set);
    case Op::compare_set: return call(&StoreState::on_compare_set);
    case Op::get: return call(&StoreState::on_get);
    case Op::add: return call(&StoreState::on_add);
    case Op::check: return call(&StoreState::on_check);
    case Op::wait: return call(&StoreState::on_wait);
    case Op::num_keys: return call(&StoreState::on_num_keys);
    case Op::watch_key: return call(&StoreState::on_watch);
    case Op::delete_key: return call(&StoreState::on_delete);
    case Op::append: return call(&StoreState::on_append);
    case Op::multi_get: return call(&StoreState::on_multi_get);
    case Op::multi_set: return call(&StoreState::on_multi_set);
    case Op::cancel_wait: return call(&StoreState::on_cancel_wait);
    case Op::queue_push: return call(&StoreState::on_queue_push);
    case Op::queue_pop: return call(&StoreState::on_queue_pop);
    case Op::queue_len: return call(&StoreState::on_queue_len);
    case Op::list_keys: return call(&StoreState::on_list_keys);
    case Op::barrier: return call(&StoreState::on_barrier);
  }
  error = "a request the store does not know";
  return false;
}

}  // namespace muster::store
