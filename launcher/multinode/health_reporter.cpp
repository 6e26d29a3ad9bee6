#include "health_reporter.hpp"

#include <boost/asio/post.hpp>

#include "muster/common/log.hpp"
#include "muster/common/text.hpp"

namespace muster::launcher {

HealthReporter::HealthReporter(boost::asio::io_context& io, std::string host, int port,
                               std::optional<rendezvous::auth::Key> key)
    : io_(io), host_(std::move(host)), port_(port), key_(std::move(key)), deadline_(io) {}

HealthReporter::~HealthReporter() {
  *alive_ = false;
  close();
}

void HealthReporter::close() {
  closed_ = true;
  waiting_.reset();
  deadline_.cancel();
  if (client_) client_->close();
  client_.reset();
}

void HealthReporter::report(rendezvous::HealthReport r) {
  if (closed_ || unsupported_) return;
  if (client_) {
    waiting_ = std::move(r);
    return;
  }
  send(std::move(r));
}

void HealthReporter::send(rendezvous::HealthReport r) {
  std::weak_ptr<bool> alive = alive_;
  const uint64_t exchange = ++exchange_;
  auto current = [this, alive, exchange] { return !alive.expired() && client_ && exchange == exchange_; };
  auto on_message = [this, current](const nlohmann::json& m) {
    if (!current()) return;
    const std::string& type = m["type"].get_ref<const std::string&>();
    if (type == "error") {
      const std::string said = rendezvous::error_text(m);
      // An older server refuses a message other than join before the join;
      // anything else costs this report only.
      if (said.find("before 'join'") != std::string::npos || said.find("unknown message type") != std::string::npos) {
        unsupported_ = true;
        log::info("the rendezvous at " + client_->address() + " does not take health reports (an older release: " +
                  log_excerpt(said, 200) + "): musterctl job will not show this node's failing check");
      } else {
        log::warning("the rendezvous at " + client_->address() + " refused this node's health report: " +
                     log_excerpt(said, 300));
      }
    }
    done();
  };
  auto on_failed = [this, current](const Status& st) {
    if (!current()) return;
    log::info("could not tell the rendezvous that this node's health check failed: " + st.message());
    done();
  };
  client_ = std::make_shared<rendezvous::RendezvousClient>(io_, host_, port_, on_message, on_failed, on_failed);
  if (key_) client_->set_auth_key(*key_);
  auto message = rendezvous::to_json(r);
  std::weak_ptr<rendezvous::RendezvousClient> weak = client_;
  client_->connect(std::chrono::duration_cast<rendezvous::Duration>(kHealthReportDeadline), [weak, message] {
    if (auto c = weak.lock()) c->send(message);
  });
  deadline_.expires_after(kHealthReportDeadline);
  deadline_.async_wait([this, current](const boost::system::error_code& ec) {
    if (ec || !current()) return;
    log::info("the rendezvous did not answer this node's health report within " +
              std::to_string(kHealthReportDeadline.count()) + " s; dropped");
    done();
  });
}

// Ends the exchange; the client goes on the next turn of the loop, not from
// inside its own callback.
void HealthReporter::done() {
  deadline_.cancel();
  auto finished = std::move(client_);
  client_.reset();
  if (finished) {
    finished->close();
    boost::asio::post(io_, [finished] {});
  }
  if (waiting_ && !unsupported_ && !closed_) {
    auto next = std::move(*waiting_);
    waiting_.reset();
    send(std::move(next));
  }
}

}  // namespace muster::launcher
