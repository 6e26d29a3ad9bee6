// The rendezvous host: the job's rendezvous server, when this node's agent is
// the one to serve it.
//
// Contract. open_c10d() hosts the rendezvous when the endpoint names this
// node (a loopback name, its host name, its --local-addr, or an address of
// one of its interfaces), as torchrun's c10d backend does, unless the
// rdzv_conf's is_host says otherwise. A port already taken means another agent
// of this machine hosts it: this one only joins, unless is_host=true was given,
// which makes that an error. open_static() is the static backend's node rank 0:
// the rendezvous has no port of its own but is reached through the workers'
// store port (--master-port), which the StoreHost opens shared with it; is_host
// plays no part there, as with torchrun's static backend, where node rank 0
// listens whatever the configuration says; the agent reserves its own rank 0
// there (reserve_own_rank), since a node claiming the rank of the one that
// serves the port is the misconfigured one. With an
// auth key every connection must prove it holds the key; without one, a
// rendezvous reachable from other machines is warned about, once. The host
// decides nothing about the job: the server (rendezvous/) does, and this
// node's agent joins it like every other through its RendezvousMember.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "muster/common/endpoint.hpp"
#include "muster/common/status.hpp"
#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/server.hpp"
#include "store_host.hpp"

namespace muster::launcher {

// How this node names itself, to recognise an endpoint as its own.
struct NodeNames {
  std::string host_name;
  std::optional<std::string> local_addr;  // --local-addr
};

class RendezvousHost {
 public:
  RendezvousHost(boost::asio::io_context& io, std::string job, std::optional<rendezvous::auth::Key> key)
      : io_(io), job_(std::move(job)), key_(std::move(key)) {}

  // Whether this node hosts the rendezvous now.
  // is_host: --rdzv-conf's is_host as resolved (absent: whether the endpoint is this machine's).
  Result<bool> open_c10d(const Endpoint& endpoint, const NodeNames& names, std::optional<bool> is_host);
  // Serves the rendezvous behind store's port (bind, port): node rank 0 of
  // the static backend.
  Status open_static(StoreHost& store, const std::string& bind, int port);

  // Keeps node rank `node_rank` of the hosted job for this node's member,
  // named `node_name`, so that no other node can take it, even by joining
  // first (the static backend's node rank 0; RendezvousServer::reserve_node_rank).
  void reserve_own_rank(int node_rank, const std::string& node_name) {
    if (server_) server_->reserve_node_rank(job_, node_rank, node_name);
  }

  bool hosting() const { return server_ != nullptr; }
  // The port the rendezvous listens on: open_c10d()'s; 0 for the static
  // backend's, which has no listener of its own (it is reached through the
  // store's port); -1 when this node hosts nothing.
  int port() const { return server_ ? server_->port() : -1; }

 private:
  // Said once, by the agent that serves the rendezvous to the network.
  void warn_if_open(const std::string& bind, int port) const;

  boost::asio::io_context& io_;
  std::string job_;
  std::optional<rendezvous::auth::Key> key_;
  std::unique_ptr<rendezvous::RendezvousServer> server_;
};

}  // namespace muster::launcher
