// Test helper for the store compatibility tests.
//   store_tool serve             muster's store on a free port; prints "PORT <n>", runs until stdin closes
//   store_tool client HOST PORT SERVER
//                                muster's client against any TCPStore server (SERVER: torch2 or torch1.13);
//                                runs a fixed scenario and prints one "name=value" line per result
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "muster/store/client.hpp"
#include "muster/store/server.hpp"

using namespace muster::store;
using namespace std::chrono_literals;

namespace {

int serve() {
  boost::asio::io_context io;
  auto server = StoreServer::listen(io, "", 0);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().message().c_str());
    return 1;
  }
  std::printf("PORT %d\n", server.value()->port());
  std::fflush(stdout);
  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](auto, int) { io.stop(); });
  boost::asio::posix::stream_descriptor in(io, ::dup(STDIN_FILENO));
  char byte = 0;
  in.async_read_some(boost::asio::buffer(&byte, 1), [&](auto, std::size_t) { io.stop(); });
  io.run();
  return 0;
}

template <typename T>
std::string show(const muster::Result<T>& r) {
  if (!r.ok()) return "error:" + r.status().message();
  if constexpr (std::is_same_v<T, bool>) return r.value() ? "true" : "false";
  else if constexpr (std::is_same_v<T, std::string>) return r.value();
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    std::string out;
    for (const auto& v : r.value()) out += (out.empty() ? "" : ",") + v;
    return out;
  } else return std::to_string(r.value());
}

std::string show(const muster::Status& s) { return s.ok() ? "ok" : "error:" + s.message(); }

int client(const std::string& host, int port, const std::string& dialect) {
  ClientOptions opts;
  opts.timeout = 20000ms;
  if (dialect == "torch1.13") {
    opts.server = ServerGeneration::torch_1_13;
  } else if (dialect != "torch2") {
    std::fprintf(stderr, "store_tool: the server is torch1.13 or torch2, not %s\n", dialect.c_str());
    return 2;
  }
  auto c = StoreClient::connect(host, port, opts);
  if (!c.ok()) {
    std::printf("connect=error:%s\n", c.status().message().c_str());
    return 1;
  }
  auto& s = c.value();
  std::printf("connect=ok\n");
  std::printf("set=%s\n", show(s.set("ours", "1")).c_str());
  std::printf("get_theirs=%s\n", show(s.get("theirs")).c_str());
  std::printf("add=%s\n", show(s.add("counter", 5)).c_str());
  std::printf("add_again=%s\n", show(s.add("counter", -2)).c_str());
  std::printf("cas_swap=%s\n", show(s.compare_set("theirs", "py", "swapped")).c_str());
  std::printf("cas_miss=%s\n", show(s.compare_set("theirs", "wrong", "x")).c_str());
  std::printf("check_present=%s\n", show(s.check({"ours", "counter"})).c_str());
  std::printf("check_absent=%s\n", show(s.check({"ours", "absent"})).c_str());
  std::printf("set_temp=%s\n", show(s.set("temp", "t")).c_str());
  std::printf("delete=%s\n", show(s.delete_key("temp")).c_str());
  std::printf("delete_again=%s\n", show(s.delete_key("temp")).c_str());
  // On 1.13, MULTI_SET and MULTI_GET go as one query per key, and APPEND is
  // refused without a byte sent, so the connection goes on.
  std::printf("multi_set=%s\n", show(s.multi_set({"m1", "m2"}, {"a", "b"})).c_str());
  std::printf("multi_get=%s\n", show(s.multi_get({"m1", "m2"})).c_str());
  std::printf("append=%s\n", show(s.append("m1", "+")).c_str());
  std::printf("get_appended=%s\n", show(s.get("m1")).c_str());
  std::printf("num_keys=%s\n", show(s.num_keys()).c_str());
  auto wait_ms = 300ms;
  auto st = s.wait({"never_set"}, wait_ms);
  std::printf("wait_timeout=%s\n", st.code() == muster::Code::timeout ? "timeout" : show(st).c_str());
  if (opts.server != ServerGeneration::torch_1_13) {
    std::printf("after_timeout=%s\n", show(s.get("ours")).c_str());
  }
  // The last key tells the peer that the scenario is over.
  auto done = StoreClient::connect(host, port, opts);
  std::printf("done=%s\n", done.ok() ? show(done.value().set("done", "yes")).c_str() : "error");
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "serve") return serve();
  if (mode == "client" && argc == 5) return client(argv[2], std::stoi(argv[3]), argv[4]);
  std::fprintf(stderr, "usage: store_tool serve | store_tool client HOST PORT torch2|torch1.13\n");
  return 2;
}
