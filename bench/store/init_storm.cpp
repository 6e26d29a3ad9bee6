// bench/store: the init storm. N simulated ranks, each its own TCP connection
// to one TCPStore server (torch 2.x wire dialect), all at once, do what
// torch.distributed.init_process_group and the gloo/NCCL set-up ask of the
// store:
//   1. connect; VALIDATE + PING (the 2.x client's handshake);
//   2. ADD "init/" 1 (TCPStore construction with a world size);
//   3. SET its address (136 bytes, a gloo endpoint's size); rank 0 also SETs
//      the NCCL unique id (128 bytes);
//   4. the store barrier on one key: ADD key 1; the rank that brings it to N
//      SETs key:last_worker; everyone WAITs on key:last_worker;
//   5. its ring neighbours' addresses: WAIT on both, MULTI_GET of both;
//   6. ranks > 0: the NCCL unique id (WAIT then GET, as TCPStore::get does);
//   7. CHECK rank 0's address.
// Prints one JSON line: the time from the first connect to the last rank
// through the barrier and to the last rank done, the requests sent, and the
// failures.
//   init_storm HOST PORT N [SOURCE_BLOCK]
// Each rank binds a source address in 127.SOURCE_BLOCK.0.0/16
// (loopback_source.hpp; block 0: the kernel's choice); at most kInFlight
// connects at once (the listen backlog).
#include <sys/resource.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loopback_source.hpp"

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kInFlight = 1024;
// A handshake left unanswered this long is redone on a new connection, a
// bounded number of times, so that a server that drops one cannot hang the run.
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
constexpr int kHandshakeAttempts = 5;
constexpr uint32_t kValidateMagic = 0x3C85F7CE;
// torch 2.x query tags.
enum : uint8_t { VALIDATE = 0, SET = 1, GET = 3, ADD = 4, CHECK = 5, WAIT = 6, MULTI_GET = 10, PING = 13 };

struct Run {
  int n = 0;
  tcp::endpoint server;
  int block = 1;
  int next = 0;  // the next rank to start
  int through_barrier = 0;
  int done = 0;
  int failed = 0;
  int handshake_retries = 0;
  long requests = 0;
  Clock::time_point t0, last_barrier, last_done;
  std::string first_error;
  std::vector<tcp::socket> held;  // the connections of the ranks done
};

// Builds one request: a tag, then fields.
struct Req {
  std::string b;
  explicit Req(uint8_t tag) { b.push_back(static_cast<char>(tag)); }
  Req& u64(uint64_t v) { return raw(&v, 8); }
  Req& i64(int64_t v) { return raw(&v, 8); }
  Req& u32(uint32_t v) { return raw(&v, 4); }
  Req& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  Req& raw(const void* p, std::size_t n) {
    b.append(static_cast<const char*>(p), n);
    return *this;
  }
};

std::string addr_key(int r) { return "/default_pg/0//rank_addr/" + std::to_string(r); }
const std::string kNcclKey = "/default_pg/0//ncclUniqueId";
const std::string kBarrierKey = "/default_pg/store_based_barrier_key:1";

struct Rank {
  tcp::socket s;
  explicit Rank(asio::io_context& io) : s(io) {}

  awaitable<void> send(Run& run, const std::string& bytes, int requests) {
    run.requests += requests;
    co_await asio::async_write(s, asio::buffer(bytes), use_awaitable);
  }
  template <typename T>
  awaitable<T> read_pod() {
    T v{};
    co_await asio::async_read(s, asio::buffer(&v, sizeof v), use_awaitable);
    co_return v;
  }
  awaitable<std::string> read_str() {
    auto n = co_await read_pod<uint64_t>();
    if (n > (1u << 20)) throw std::runtime_error("a reply of " + std::to_string(n) + " bytes");
    std::string v(n, '\0');
    co_await asio::async_read(s, asio::buffer(v), use_awaitable);
    co_return v;
  }
};

awaitable<void> rank_main(asio::io_context& io, Run& run, int r);

void start_next(asio::io_context& io, Run& run) {
  if (run.next >= run.n) return;
  int r = run.next++;
  asio::co_spawn(io, rank_main(io, run, r), [&run](std::exception_ptr e) {
    if (!e) return;
    ++run.failed;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      if (run.first_error.empty()) run.first_error = ex.what();
    }
  });
}

// Opens the connection from rank r's source address.
awaitable<void> connect(Rank& k, Run& run, int r) {
  boost::system::error_code ec;
  bench::bind_loopback_source(k.s, static_cast<unsigned>(run.block), static_cast<unsigned>(r), ec);
  if (ec) throw boost::system::system_error(ec, "socket/bind");
  co_await k.s.async_connect(run.server, use_awaitable);
  k.s.set_option(tcp::no_delay(true));
}

awaitable<void> rank_main(asio::io_context& io, Run& run, int r) {
  Rank k(io);
  try {
    co_await connect(k, run, r);
  } catch (...) {
    start_next(io, run);  // keep the storm going
    throw;
  }
  start_next(io, run);
  // 1. Handshake, each request its own write, as torch's client flushes each
  // one. A PING left unanswered for kHandshakeTimeout is given up and the
  // handshake redone on a new connection.
  for (int attempt = 1;; ++attempt) {
    // The timer's handler may run after this attempt ended (a completion
    // already queued when cancel() came): it looks at the shared state only.
    enum class Attempt { pending, answered, timed_out };
    auto state = std::make_shared<Attempt>(Attempt::pending);
    asio::steady_timer guard(io, kHandshakeTimeout);
    guard.async_wait([state, &k](const boost::system::error_code& ec) {
      if (ec || *state != Attempt::pending) return;
      *state = Attempt::timed_out;
      boost::system::error_code ignored;
      k.s.close(ignored);
    });
    try {
      co_await k.send(run, Req(VALIDATE).u32(kValidateMagic).b, 1);
      co_await k.send(run, Req(PING).u32(static_cast<uint32_t>(r)).b, 1);
      if (co_await k.read_pod<uint32_t>() != static_cast<uint32_t>(r)) throw std::runtime_error("PING: wrong nonce");
      // The answer and the timer may both have completed: the timer closed the socket.
      if (*state == Attempt::timed_out) throw std::runtime_error("handshake: timed out");
      *state = Attempt::answered;
      guard.cancel();
      break;
    } catch (...) {
      bool timed_out = *state == Attempt::timed_out;
      *state = Attempt::answered;  // settled: a late timer touches nothing
      guard.cancel();
      if (!timed_out || attempt >= kHandshakeAttempts) throw;
    }
    ++run.handshake_retries;
    k.s = tcp::socket(io);
    co_await connect(k, run, r);
  }
  // 2. TCPStore construction.
  co_await k.send(run, Req(ADD).str("init/").i64(1).b, 1);
  co_await k.read_pod<int64_t>();
  // 3. Its address; rank 0 the NCCL unique id.
  co_await k.send(run, Req(SET).str(addr_key(r)).str(std::string(136, static_cast<char>('a' + r % 26))).b, 1);
  if (r == 0) co_await k.send(run, Req(SET).str(kNcclKey).str(std::string(128, 'u')).b, 1);
  // 4. The barrier.
  co_await k.send(run, Req(ADD).str(kBarrierKey).i64(1).b, 1);
  auto arrived = co_await k.read_pod<int64_t>();
  if (arrived == run.n) co_await k.send(run, Req(SET).str(kBarrierKey + ":last_worker").str("1").b, 1);
  co_await k.send(run, Req(WAIT).u64(1).str(kBarrierKey + ":last_worker").b, 1);
  if (co_await k.read_pod<uint8_t>() != 0) throw std::runtime_error("WAIT: not STOP_WAITING");
  ++run.through_barrier;
  run.last_barrier = Clock::now();
  // 5. The ring neighbours.
  std::string left = addr_key((r + run.n - 1) % run.n), right = addr_key((r + 1) % run.n);
  co_await k.send(run, Req(WAIT).u64(2).str(left).str(right).b, 1);
  if (co_await k.read_pod<uint8_t>() != 0) throw std::runtime_error("WAIT: not STOP_WAITING");
  co_await k.send(run, Req(MULTI_GET).u64(2).str(left).str(right).b, 1);
  for (int i = 0; i < 2; ++i)
    if ((co_await k.read_str()).size() != 136) throw std::runtime_error("MULTI_GET: a wrong value");
  // 6. The NCCL unique id.
  if (r != 0) {
    co_await k.send(run, Req(WAIT).u64(1).str(kNcclKey).b, 1);
    if (co_await k.read_pod<uint8_t>() != 0) throw std::runtime_error("WAIT: not STOP_WAITING");
    co_await k.send(run, Req(GET).str(kNcclKey).b, 1);
    if ((co_await k.read_str()).size() != 128) throw std::runtime_error("GET: a wrong value");
  }
  // 7. CHECK.
  co_await k.send(run, Req(CHECK).u64(1).str(addr_key(0)).b, 1);
  if (co_await k.read_pod<uint8_t>() != 0) throw std::runtime_error("CHECK: not READY");
  ++run.done;
  run.last_done = Clock::now();
  // Hold the connection until the run ends, as ranks hold theirs.
  run.held.push_back(std::move(k.s));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: init_storm HOST PORT N [SOURCE_BLOCK]\n");
    return 2;
  }
  Run run;
  run.server = tcp::endpoint(asio::ip::make_address(argv[1]), static_cast<uint16_t>(std::atoi(argv[2])));
  run.n = std::atoi(argv[3]);
  run.block = argc > 4 ? std::atoi(argv[4]) : 1;
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < static_cast<rlim_t>(run.n) + 64) {
    std::printf("{\"error\": \"%d ranks need %d descriptors; the limit is %llu\"}\n", run.n, run.n + 64,
                static_cast<unsigned long long>(lim.rlim_cur));
    return 1;
  }
  asio::io_context io(1);
  run.t0 = Clock::now();
  for (int i = 0; i < kInFlight; ++i) start_next(io, run);
  // Bounded: a server that stops answering ends the run after the limit.
  auto deadline = Clock::now() + std::chrono::seconds(60 + run.n / 100);
  while (run.done + run.failed < run.n && Clock::now() < deadline) io.run_for(std::chrono::milliseconds(10));
  io.run_for(std::chrono::milliseconds(50));
  auto ms = [&](Clock::time_point t) {
    return t == Clock::time_point{} ? -1.0 : std::chrono::duration<double, std::milli>(t - run.t0).count();
  };
  std::string err;
  for (char c : run.first_error) err += (c == '"' || c == '\\') ? ' ' : c;
  std::printf(
      "{\"ranks\": %d, \"barrier_ms\": %.1f, \"done_ms\": %.1f, \"requests\": %ld, \"through_barrier\": %d, "
      "\"done\": %d, \"failed\": %d, \"handshake_retries\": %d, \"first_error\": \"%s\"}\n",
      run.n, ms(run.last_barrier), ms(run.last_done), run.requests, run.through_barrier, run.done, run.failed,
      run.handshake_retries, err.c_str());
  return run.done == run.n ? 0 : 1;
}
