#include "rendezvous_host.hpp"

#include "exposure.hpp"
#include "muster/common/log.hpp"

namespace muster::launcher {

void RendezvousHost::warn_if_open(const std::string& bind, int port) const {
  if (key_ || !beyond_loopback(bind)) return;
  log::warning("the rendezvous of job '" + job_ + "' on " + (bind.empty() ? "every interface" : bind) + ", port " +
               std::to_string(port) +
               ", authenticates nobody: whoever reaches it can join the job, take its rank 0 or end it; give "
               "every agent the same --auth-key-file (docs/security.md)");
}

Result<bool> RendezvousHost::open_c10d(const Endpoint& endpoint, const NodeNames& names, std::optional<bool> is_host) {
  const std::string& host = endpoint.host;
  bool ours = is_loopback_name(host) || host == names.host_name || (names.local_addr && host == *names.local_addr) ||
              is_own_address(host);
  if (!is_host.value_or(ours)) return false;
  const bool explicit_host = is_host.has_value();
  std::string bind = host == "localhost" ? "127.0.0.1" : listen_address_for(strip_brackets(host));
  auto server = rendezvous::RendezvousServer::listen(io_, bind, endpoint.port);
  if (!server.ok()) {
    // Taken: another agent of this machine hosts it, and this one joins.
    if (explicit_host) return Status(Code::unavailable, "is_host=true, but " + server.status().message());
    return false;
  }
  server_ = std::move(server.value());
  if (key_) server_->require_auth(*key_);
  warn_if_open(bind, port());
  log::info("hosting the rendezvous of job '" + job_ + "' on " + endpoint.to_string());
  return true;
}

Status RendezvousHost::open_static(StoreHost& store, const std::string& bind, int port) {
  server_ = rendezvous::RendezvousServer::create(io_);
  if (key_) server_->require_auth(*key_);
  if (auto st = store.serve_shared(bind, port, *server_); !st.ok()) {
    server_.reset();
    return Status(Code::unavailable, "node rank 0 cannot serve --master-port " + std::to_string(port) + ": " +
                                         st.message());
  }
  warn_if_open(bind, store.port());
  return {};
}

}  // namespace muster::launcher
