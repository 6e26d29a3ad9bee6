#include "muster/store/client.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

namespace muster::store {
namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// One connection attempt to every address of host:port; -1 and errno on failure.
int try_connect(const std::string& host, int port, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    error = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc_connect = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc_connect == 0) break;
    if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int soerr = 0;
      socklen_t len = sizeof soerr;
      if (poll(&p, 1, remaining_ms(deadline)) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 &&
          soerr == 0) {
        break;
      }
      error = soerr != 0 ? std::strerror(soerr) : "connection timed out";
    } else {
      error = std::strerror(errno);
    }
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int flags = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &flags, sizeof flags);
  }
  return fd;
}

}  // namespace

StoreClient::StoreClient(StoreClient&& o) noexcept : fd_(o.fd_), options_(o.options_), address_(std::move(o.address_)) {
  o.fd_ = -1;
}

StoreClient& StoreClient::operator=(StoreClient&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    options_ = o.options_;
    address_ = std::move(o.address_);
    o.fd_ = -1;
  }
  return *this;
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

Result<StoreClient> StoreClient::connect(const std::string& host, int port, ClientOptions options) {
  StoreClient c;
  c.options_ = options;
  c.address_ = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  auto deadline = Clock::now() + options.timeout;
  std::mt19937 jitter(static_cast<unsigned>(getpid()));
  auto backoff = std::chrono::milliseconds(50);
  std::string error = "no attempt made";
  // Bounded by the deadline: the server may not be up yet.
  while (true) {
    c.fd_ = try_connect(host, port, deadline, error);
    if (c.fd_ >= 0) {
      if (options.dialect == Dialect::v2) {
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
        ::close(c.fd_);
        c.fd_ = -1;
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

std::string StoreClient::local_host() const {
  if (fd_ < 0) return "";
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  std::string h = host;
  // An IPv4 peer reached through a dual-stack socket.
  if (h.rfind("::ffff:", 0) == 0 && h.find('.') != std::string::npos) h = h.substr(7);
  return h;
}

Clock::time_point StoreClient::deadline() const { return Clock::now() + options_.timeout; }

Status StoreClient::broken(Status why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return why;
}

Status StoreClient::send(const Request& r) {
  if (fd_ < 0) return Status(Code::closed, "the connection to the store at " + address_ + " is closed");
  std::string bytes = encode_request(options_.dialect, r);
  std::size_t done = 0;
  auto until = deadline();
  while (done < bytes.size()) {
    ssize_t w = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (w > 0) {
      done += static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (poll(&p, 1, remaining_ms(until)) <= 0) {
        return broken(Status(Code::timeout, "sending to the store at " + address_ + " timed out"));
      }
      continue;
    }
    return broken(io_error("lost the store at " + address_ + ": " + std::strerror(errno)));
  }
  return {};
}

Status StoreClient::recv_exact(char* out, std::size_t n, Clock::time_point until) {
  if (fd_ < 0) return Status(Code::closed, "the connection to the store at " + address_ + " is closed");
  std::size_t done = 0;
  while (done < n) {
    pollfd p{fd_, POLLIN, 0};
    int ready = poll(&p, 1, remaining_ms(until));
    if (ready == 0) return Status(Code::timeout, "the store at " + address_ + " did not answer in time");
    if (ready < 0 && errno == EINTR) continue;
    ssize_t r = ::recv(fd_, out + done, n - done, 0);
    if (r > 0) {
      done += static_cast<std::size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    return broken(Status(Code::closed, r == 0 ? "the store at " + address_ + " closed the connection"
                                              : "lost the store at " + address_ + ": " + std::strerror(errno)));
  }
  return {};
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
  if (options_.dialect == Dialect::v1_13) {
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
  if (tag_of(options_.dialect, r.op) == 0xff) return invalid_argument("APPEND needs the torch 2.x dialect");
  return send(r);
}

Result<std::vector<std::string>> StoreClient::multi_get(const std::vector<std::string>& ks) {
  if (auto st = wait(ks); !st.ok()) return st;
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
  Request r;
  r.op = Op::multi_set;
  r.keys = keys(ks);
  r.values = values;
  return send(r);
}

}  // namespace muster::store
