// One TCP port for two servers: the static backend's node rank 0 serves the
// workers' store and the agents' rendezvous on --master-port, as torchrun's
// static rendezvous does with its TCPStore. Each connection's first bytes say
// which: a rendezvous frame starts with a 4-byte big-endian length of at most
// kMaxFrame (so a zero byte, then a byte of at most 0x10) and a '{'; no
// TCPStore request of any torch version starts that way (a 2.x client opens
// with VALIDATE, 0 then a 4-byte magic; a 1.13 client's first byte names a
// query, and its SET (0) is followed by an 8-byte length). The connection then
// goes, with the bytes read, to the store's or the rendezvous's adopt().
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "muster/common/status.hpp"
#include "muster/net/asio_tcp.hpp"

namespace muster::launcher {

class SharedPort {
 public:
  using Handoff = std::function<void(boost::asio::ip::tcp::socket, std::string already_read)>;
  // Connections still undecided at once (each holds a socket and at most a
  // few bytes), in all and from one IP address; past either a new connection
  // is closed at once (logged at most every 5 s) until one decides or goes.
  // No deadline: a TCPStore client may connect well before its first request,
  // as the store itself allows; the per-address cap keeps one host from
  // locking the others out.
  static constexpr std::size_t kMaxUndecided = 10000;
  static constexpr std::size_t kMaxUndecidedPerPeer = 256;

  enum class Verdict { need_more, store, rendezvous };
  // What a connection's first bytes say.
  static Verdict classify(std::string_view first_bytes);

  // Listens on host:port (host "" for every address; port 0 picks one).
  static Result<std::unique_ptr<SharedPort>> listen(boost::asio::io_context& io, const std::string& host, int port,
                                                    Handoff to_store, Handoff to_rendezvous);
  ~SharedPort();
  SharedPort(const SharedPort&) = delete;
  SharedPort& operator=(const SharedPort&) = delete;

  int port() const { return acceptor_.port(); }
  std::size_t undecided() const { return undecided_.size(); }
  void close();

 private:
  SharedPort(boost::asio::io_context& io, Handoff to_store, Handoff to_rendezvous);
  void take(boost::asio::ip::tcp::socket socket);
  void read_more(std::uint64_t id, std::shared_ptr<std::string> bytes);

  net::Acceptor acceptor_;
  Handoff to_store_;
  Handoff to_rendezvous_;
  std::uint64_t next_id_ = 1;
  struct Undecided {
    std::shared_ptr<boost::asio::ip::tcp::socket> socket;
    std::string peer;  // its IP address
  };
  void forget(std::map<std::uint64_t, Undecided>::iterator it);
  std::map<std::uint64_t, Undecided> undecided_;
  std::map<std::string, std::size_t> per_peer_;
  std::chrono::steady_clock::time_point last_refusal_logged_{};
};

}  // namespace muster::launcher
