// The store host: the workers' store that this node's agent serves (torch
// 2.x's agent store, so that a worker's death never takes the store down), or,
// with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, the port it holds for worker 0's.
//
// Contract. serve() opens the store on an address and port (0: any free one),
// replacing any store open before; serve_shared() opens it behind a
// SharedPort that hands rendezvous connections to a RendezvousServer (the
// static backend's node rank 0, whose --master-port carries both);
// new_round() gives a round of a c10d job a fresh store on a free port or,
// failing that, empties the old one. serve() and new_round() close a shared
// port opened before (and with it the rendezvous's way in): the static
// backend, which shares its port, calls neither after serve_shared().
// reserve() holds a port for worker 0's store. attempt_starting(), just
// before each attempt's workers start, lets a reservation go and, in a
// one-node job (Emptying::each_attempt), empties the store: nothing of the
// workers that just died (their addresses, their barrier counts) can mislead
// the new ones. A multi-node job's store is emptied by rounds instead
// (Emptying::by_rounds): node rank 0 starting its workers must not wipe what
// other nodes' workers wrote, and the static backend's store keeps its keys
// across rounds, as torchrun's does. With an
// observer (watch: the worker timeout's), every request and every closed
// connection of the store is told to it, with the store's port.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "muster/rendezvous/server.hpp"
#include "muster/store/server.hpp"
#include "port_reservation.hpp"
#include "shared_port.hpp"

namespace muster::launcher {

// Who hears of the store's traffic (the worker timeout: a request is its
// worker's progress).
struct StoreObserver {
  std::function<void(store::ConnId conn, const boost::asio::ip::tcp::endpoint& peer, int store_port)> request;
  std::function<void(store::ConnId conn, int store_port)> closed;
};

class StoreHost {
 public:
  enum class Emptying { each_attempt, by_rounds };
  StoreHost(boost::asio::io_context& io, Emptying emptying) : io_(io), emptying_(emptying) {}

  void watch(StoreObserver observer) { observer_ = std::move(observer); }

  Status serve(const std::string& bind, int port);
  Status serve_shared(const std::string& bind, int port, rendezvous::RendezvousServer& rendezvous);
  Status new_round(const std::string& bind);

  Status reserve(int port);
  void attempt_starting();

  bool serving() const { return store_ != nullptr; }
  // The port the workers reach the store on (the shared one, the reserved
  // one); 0 when there is none.
  int port() const;

 private:
  void observe();

  boost::asio::io_context& io_;
  Emptying emptying_;
  StoreObserver observer_;
  std::unique_ptr<store::StoreServer> store_;
  std::unique_ptr<SharedPort> shared_;
  std::optional<PortReservation> reservation_;
};

}  // namespace muster::launcher
