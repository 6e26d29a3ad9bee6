#include "muster/store/client.hpp"

#include <unistd.h>

#include <random>
#include <thread>

#include "muster/net/socket.hpp"

namespace muster::store {

using Clock = std::chrono::steady_clock;

StoreClient::StoreClient(StoreClient&&) noexcept = default;
StoreClient& StoreClient::operator=(StoreClient&&) noexcept = default;
StoreClient::~StoreClient() = default;

Result<StoreClient> StoreClient::connect(const std::string& host, int port, ClientOptions options) {
  StoreClient c;
  c.options_ = options;
  c.address_ = net::host_port(host, port);
  auto deadline = Clock::now() + options.timeout;
  std::mt19937 jitter(static_cast<unsigned>(getpid()));
  auto backoff = std::chrono::milliseconds(50);
  std::string error = "no attempt made";
  // Bounded by the deadline: the server may not be up yet.
  while (true) {
    auto fd = net::connect_tcp(host, port, deadline);
    if (!fd.ok()) error = fd.status().message();
    if (fd.ok()) {
      c.fd_ = std::move(fd.value());
      if (dialect_of(options.server) == Dialect::with_validate) {
        Request validate;
        validate.op = Op::validate;
        validate.u32 = kValidateMagic;
        Request ping;
        ping.op = Op::ping;
        ping.u32 = static_cast<uint32_t>(getpid());
        uint32_t echo = 0;
        Status st = c.send(validate);
        if (st.ok()) st = c.send(ping);
        if (st.ok()) st = c.recv_exact(reinterpret_cast<char*>(&echo), 4, deadline);
        if (st.ok() && echo == ping.u32) return c;
        error = st.ok() ? "the server answered PING with a different value (not a TCPStore?)" : st.message();
        c.fd_.reset();
      } else {
        return c;
      }
    }
    if (Clock::now() + backoff >= deadline) break;
    auto sleep = backoff / 2 + std::chrono::milliseconds(jitter() % (backoff.count() + 1));
    std::this_thread::sleep_for(sleep);
    backoff = std::min(backoff * 3 / 2, std::chrono::milliseconds(2000));
  }
  return Status(Code::unavailable, "cannot reach the store at " + c.address_ + " within " +
                                       std::to_string(options.timeout.count()) + " ms: " + error +
                                       "; check MASTER_ADDR/MASTER_PORT and that the store is running");
}

std::string StoreClient::local_host() const { return fd_ ? net::local_address(fd_.get()) : ""; }

Clock::time_point StoreClient::deadline() const { return Clock::now() + options_.timeout; }

Status StoreClient::broken(Status why) {
  fd_.reset();
  return why;
}

Status StoreClient::send(const Request& r) {
  if (!fd_) return Status(Code::closed, "the connection to the store at " + address_ + " is closed");
  std::string bytes = encode_request(dialect_of(options_.server), r);
  if (auto st = net::send_all(fd_.get(), bytes.data(), bytes.size(), deadline(), "the store at " + address_); !st.ok()) {
    return broken(st);
  }
  return {};
}

// Does not close the connection itself: recv_u8 keeps it after a timed-out wait.
Status StoreClient::recv_exact(char* out, std::size_t n, Clock::time_point until) {
  if (!fd_) return Status(Code::closed, "the connection to the store at " + address_ + " is closed");
  auto st = net::recv_all(fd_.get(), out, n, until, "the store at " + address_);
  if (!st.ok() && st.code() != Code::timeout) return broken(st);
  return st;
}

Result<std::string> StoreClient::recv_string(Clock::time_point until) {
  uint64_t len = 0;
  if (auto st = recv_exact(reinterpret_cast<char*>(&len), 8, until); !st.ok()) return broken(st);
  if (len > kMaxValueLength) return broken(io_error("the store at " + address_ + " sent an oversized value"));
  std::string s(static_cast<std::size_t>(len), '\0');
  if (auto st = recv_exact(s.data(), s.size(), until); !st.ok()) return broken(st);
  return s;
}

Result<int64_t> StoreClient::recv_i64(Clock::time_point until) {
  int64_t v = 0;
  if (auto st = recv_exact(reinterpret_cast<char*>(&v), 8, until); !st.ok()) return broken(st);
  return v;
}

Result<uint8_t> StoreClient::recv_u8(Clock::time_point until, bool keep_on_timeout) {
  uint8_t v = 0;
  if (auto st = recv_exact(reinterpret_cast<char*>(&v), 1, until); !st.ok()) {
    // A wait may time out and be cancelled; any other late answer would put
    // the connection out of step, so it is closed.
    if (keep_on_timeout && st.code() == Code::timeout) return st;
    return broken(st);
  }
  return v;
}

std::vector<std::string> StoreClient::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

Status StoreClient::set(const std::string& k, std::string_view value) {
  Request r;
  r.op = Op::set;
  r.keys = {key(k)};
  r.values = {std::string(value)};
  return send(r);
}

Result<std::string> StoreClient::get(const std::string& k) {
  if (auto st = wait({k}); !st.ok()) return st;
  Request r;
  r.op = Op::get;
  r.keys = {key(k)};
  if (auto st = send(r); !st.ok()) return st;
  return recv_string(deadline());
}

Result<int64_t> StoreClient::add(const std::string& k, int64_t delta) {
  Request r;
  r.op = Op::add;
  r.keys = {key(k)};
  r.number = delta;
  if (auto st = send(r); !st.ok()) return st;
  return recv_i64(deadline());
}

Result<std::string> StoreClient::compare_set(const std::string& k, std::string_view expected, std::string_view desired) {
  Request r;
  r.op = Op::compare_set;
  r.keys = {key(k)};
  r.values = {std::string(expected), std::string(desired)};
  if (auto st = send(r); !st.ok()) return st;
  return recv_string(deadline());
}

Result<bool> StoreClient::check(const std::vector<std::string>& ks) {
  Request r;
  r.op = Op::check;
  r.keys = keys(ks);
  if (auto st = send(r); !st.ok()) return st;
  auto v = recv_u8(deadline());
  if (!v.ok()) return v.status();
  return v.value() == kReady;
}

Status StoreClient::wait(const std::vector<std::string>& ks) { return wait(ks, options_.timeout); }

Status StoreClient::wait(const std::vector<std::string>& ks, std::chrono::milliseconds timeout) {
  Request r;
  r.op = Op::wait;
  r.keys = keys(ks);
  if (auto st = send(r); !st.ok()) return st;
  auto until = Clock::now() + timeout;
  auto v = recv_u8(until, true);
  if (v.ok()) {
    if (v.value() != kStopWaiting) return broken(io_error("the store at " + address_ + " answered WAIT oddly"));
    return {};
  }
  if (v.status().code() != Code::timeout) return v.status();
  std::string what = "wait timeout after " + std::to_string(timeout.count()) + "ms for the key(s)";
  for (const auto& k : ks) what += " '" + k + "'";
  if (!server_answers(options_.server, Op::cancel_wait)) {
    // 1.13 servers cannot cancel a wait: its late answer would arrive as the
    // reply to the next call, so this connection cannot be used again.
    return broken(Status(Code::timeout, what + " (the connection is closed: 1.13 stores cannot cancel a wait)"));
  }
  Request cancel;
  cancel.op = Op::cancel_wait;
  if (auto st = send(cancel); !st.ok()) return st;
  auto ack = recv_u8(deadline());
  if (!ack.ok()) return ack.status();
  if (ack.value() == kStopWaiting) {
    // The keys arrived just before the cancel; the cancel's own answer follows.
    auto second = recv_u8(deadline());
    if (!second.ok()) return second.status();
    return {};
  }
  return Status(Code::timeout, what);
}

Result<int64_t> StoreClient::num_keys() {
  Request r;
  r.op = Op::num_keys;
  if (auto st = send(r); !st.ok()) return st;
  return recv_i64(deadline());
}

Result<bool> StoreClient::delete_key(const std::string& k) {
  Request r;
  r.op = Op::delete_key;
  r.keys = {key(k)};
  if (auto st = send(r); !st.ok()) return st;
  auto v = recv_i64(deadline());
  if (!v.ok()) return v.status();
  return v.value() == 1;
}

Status StoreClient::append(const std::string& k, std::string_view value) {
  Request r;
  r.op = Op::append;
  r.keys = {key(k)};
  r.values = {std::string(value)};
  if (!server_answers(options_.server, r.op)) {
    return invalid_argument("the store at " + address_ + " (torch 1.13) has no APPEND; nothing was sent");
  }
  return send(r);
}

Result<std::vector<std::string>> StoreClient::multi_get(const std::vector<std::string>& ks) {
  if (auto st = wait(ks); !st.ok()) return st;
  if (!server_answers(options_.server, Op::multi_get)) {
    std::vector<std::string> out;
    for (const auto& k : ks) {
      auto v = get(k);
      if (!v.ok()) return v.status();
      out.push_back(std::move(v.value()));
    }
    return out;
  }
  Request r;
  r.op = Op::multi_get;
  r.keys = keys(ks);
  if (auto st = send(r); !st.ok()) return st;
  std::vector<std::string> out;
  auto until = deadline();
  for (std::size_t i = 0; i < ks.size(); ++i) {
    auto v = recv_string(until);
    if (!v.ok()) return v.status();
    out.push_back(std::move(v.value()));
  }
  return out;
}

Status StoreClient::multi_set(const std::vector<std::string>& ks, const std::vector<std::string>& values) {
  if (ks.size() != values.size()) return invalid_argument("multi_set needs as many values as keys");
  if (!server_answers(options_.server, Op::multi_set)) {
    for (std::size_t i = 0; i < ks.size(); ++i) {
      if (auto st = set(ks[i], values[i]); !st.ok()) return st;
    }
    return {};
  }
  Request r;
  r.op = Op::multi_set;
  r.keys = keys(ks);
  r.values = values;
  return send(r);
}

}  // namespace muster::store
