// musterd: the rendezvous daemon. Hosts any number of jobs keyed by rdzv_id;
// agents reach it with --rdzv-backend=c10d --rdzv-endpoint=<host>:<port>.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "daemon_cli.hpp"
#include "muster/common/endpoint.hpp"
#include "muster/common/log.hpp"
#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/server.hpp"

namespace {

// systemd's readiness protocol (Type=notify), without linking libsystemd.
void notify_systemd(const char* state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::size_t len = std::strlen(path);
  if (len >= sizeof addr.sun_path) {
    ::close(fd);
    return;
  }
  std::memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  ::sendto(fd, state, std::strlen(state), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr),
           static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len));
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  muster::daemon::Options opt;
  CLI::App app;
  muster::daemon::define(app, opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2, as getopt tools do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  opt.apply();
  const auto& limits = opt.limits;
  std::string listen = opt.listen;
  const std::string& key_file = opt.key_file;

  // A daemon says what it does (jobs, rounds, losses) unless LOGLEVEL says otherwise.
  muster::log::set_level(muster::log::Level::info);
  muster::log::init_from_env("musterd");
  // One descriptor per agent or store client: take the whole hard limit.
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  bool loopback_default = listen.empty();
  if (loopback_default) listen = "127.0.0.1:29400";
  auto ep = muster::parse_endpoint(listen, 29400);
  if (!ep.ok()) {
    std::cerr << "musterd: error: --listen: " << ep.status().message() << "\n";
    return 2;
  }
  auto key = muster::rendezvous::auth::find_key(key_file, std::getenv("MUSTER_AUTH_KEY_FILE"),
                                                std::getenv("CREDENTIALS_DIRECTORY"));
  if (!key.ok()) {
    std::cerr << "musterd: error: " << key.status().message() << "\n";
    return 2;
  }
  boost::asio::io_context io(1);
  auto server = muster::rendezvous::RendezvousServer::listen(io, ep->host == "localhost" ? "127.0.0.1" : ep->host,
                                                             ep->port, limits);
  if (!server.ok()) {
    std::cerr << "musterd: error: " << server.status().message() << "\n";
    return 1;
  }
  if (key.value()) server.value()->require_auth(key.value()->key);
  // The port line comes first on stdout, so scripts can use --listen ADDR:0.
  std::cout << "musterd listening on " << ep->host << ":" << server.value()->port() << std::endl;
  if (loopback_default) {
    muster::log::warning("musterd: listening on loopback only (127.0.0.1:29400): agents on other hosts cannot "
                         "reach it; give --listen ADDR:PORT (0.0.0.0:29400 for every interface)");
  }
  bool loopback = ep->host == "localhost" || ep->host.rfind("127.", 0) == 0 || ep->host == "::1" ||
                  ep->host == "[::1]";
  if (key.value()) {
    muster::log::info("musterd: agents must prove they hold the key from " + key.value()->source);
  } else if (!loopback) {
    muster::log::warning("musterd: no auth key: any process that reaches " + ep->host + ":" +
                         std::to_string(server.value()->port()) +
                         " can join a job, take its rank 0 or end it; give --auth-key-file (docs/security.md)");
  }
  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](const boost::system::error_code&, int signo) {
    notify_systemd("STOPPING=1");
    muster::log::warning("musterd: signal " + std::to_string(signo) + ", shutting down");
    server.value()->close();
    io.stop();
  });
  notify_systemd("READY=1");
  io.run();
  return 0;
}
