#include "store_host.hpp"

#include "muster/common/log.hpp"

namespace muster::launcher {

Status StoreHost::serve(const std::string& bind, int port) {
  auto server = store::StoreServer::listen(io_, bind, port);
  if (!server.ok()) return server.status();
  shared_.reset();
  store_ = std::move(server.value());
  observe();
  return {};
}

Status StoreHost::serve_shared(const std::string& bind, int port, rendezvous::RendezvousServer& rendezvous) {
  auto store = store::StoreServer::create(io_);
  store::StoreServer* to_store = store.get();
  auto shared = SharedPort::listen(
      io_, bind, port,
      [to_store](boost::asio::ip::tcp::socket s, std::string read) { to_store->adopt(std::move(s), std::move(read)); },
      [&rendezvous](boost::asio::ip::tcp::socket s, std::string read) {
        rendezvous.adopt(std::move(s), std::move(read));
      });
  if (!shared.ok()) return shared.status();
  // The old port's connections go before the store they were handed to.
  shared_ = std::move(shared.value());
  store_ = std::move(store);
  observe();
  return {};
}

Status StoreHost::new_round(const std::string& bind) {
  auto fresh = store::StoreServer::listen(io_, bind, 0);
  if (fresh.ok()) {
    shared_.reset();
    store_ = std::move(fresh.value());
    observe();
    return {};
  }
  if (!store_) return fresh.status();
  log::warning("cannot open a new store for the next round (" + fresh.status().message() + "); emptying the old one");
  store_->reset();
  return {};
}

void StoreHost::attempt_starting() {
  if (reservation_) reservation_->release();
  if (emptying_ == Emptying::each_attempt && store_) store_->reset();
}

Status StoreHost::reserve(int port) {
  auto reserved = PortReservation::acquire(port);
  if (!reserved.ok()) return reserved.status();
  reservation_ = std::move(reserved.value());
  return {};
}


int StoreHost::port() const {
  if (shared_) return shared_->port();
  if (store_) return store_->port();
  if (reservation_) return reservation_->port();
  return 0;
}

void StoreHost::observe() {
  if (!store_ || !observer_.request || !observer_.closed) return;
  int port = this->port();
  store_->observe_requests([request = observer_.request, port](store::ConnId conn,
                                                               const boost::asio::ip::tcp::endpoint& peer) {
    request(conn, peer, port);
  });
  store_->observe_closes([closed = observer_.closed, port](store::ConnId conn) { closed(conn, port); });
}

}  // namespace muster::launcher
