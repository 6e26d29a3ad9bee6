// The rendezvous server: many jobs keyed by rdzv_id on one Asio io_context,
// each a Rendezvous core with its own timer. musterd runs it; an agent that
// hosts its job's rendezvous runs the same code.
//
// Hostile input stays with its connection: a bad frame, malformed or too deep
// JSON, a wrong-typed or out-of-range field, an unknown type or a message out
// of order gets an `error` frame, is logged once (truncated) and closes that
// connection only; no exception leaves a session. Every resource a peer can
// make the server hold is bounded (ServerLimits, docs/protocol.md "Limits").
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <array>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

#include "muster/common/status.hpp"
#include "muster/net/session_server.hpp"
#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/core.hpp"
#include "muster/rendezvous/health_board.hpp"
#include "muster/rendezvous/protocol.hpp"

namespace muster::rendezvous {

// The named limits, with their defaults.
struct ServerLimits {
  std::size_t max_jobs = 10000;                 // jobs open at once; one more is rejected (unavailable)
  std::size_t max_connections_per_peer = 4096;  // from one IP address; one more is closed at once
  Duration join_wait = std::chrono::seconds(30);  // a connection that has not joined by then is closed
  std::size_t max_queued_bytes = 8 * 1024 * 1024;  // unsent bytes to one peer; past it, it is closed
  // A finished job leaves a tombstone (so a late joiner learns it is closed)
  // for this long; at most max_tombstones are kept, the oldest go first.
  Duration finished_job_lifetime = std::chrono::hours(1);
  std::size_t max_tombstones = 100000;
};

// Why the server refused a connection or a join: musterd's metric label.
enum class Rejection {
  auth,                  // no or a wrong key
  bad_message,           // a frame or message that does not decode
  no_join,               // no join within the join wait
  connections_per_peer,  // one address holds too many connections
  max_jobs,              // too many jobs open
  job_closed,            // a join to a finished or failed job
  job_settings,          // a join whose --nnodes or backend is not the job's
  internal,              // anything else
};
inline constexpr Rejection kRejections[] = {Rejection::auth,       Rejection::bad_message,
                                            Rejection::no_join,    Rejection::connections_per_peer,
                                            Rejection::max_jobs,   Rejection::job_closed,
                                            Rejection::job_settings, Rejection::internal};
const char* rejection_name(Rejection r);

// What the server holds and has done, for its metrics.
struct ServerStats {
  std::map<std::string, std::size_t> jobs;  // by state: forming, running, closed; succeeded, failed (remembered)
  std::size_t nodes = 0;                    // members of open jobs
  std::size_t connections = 0;
  Counters totals;                          // over every job since start
  std::map<std::string, uint64_t> rejected;  // connections and joins refused, by reason (every one, 0 or more)
  uint64_t behind = 0;         // times a job's timer fired kLagTolerance or more late
  double behind_seconds = 0;   // and by how much, in all
  uint64_t health_reports = 0;  // `health` reports of failing checks received
  std::size_t unhealthy = 0;    // nodes whose failing check is on the board now
};

// A job's timer that fires this late means the event loop could not run (nor
// read the members' heartbeats) for that long: the lag is forgiven them.
constexpr std::chrono::milliseconds kLagTolerance{100};
// How often "musterd is behind" is said at most.
constexpr std::chrono::seconds kBehindNoteEvery{10};

class RendezvousServer {
 public:
  static Result<std::unique_ptr<RendezvousServer>> listen(boost::asio::io_context& io, const std::string& host,
                                                          int port, ServerLimits limits = {});
  // A server without a listener of its own: it serves connections handed to
  // it with adopt() (the static backend, sharing the store's port).
  static std::unique_ptr<RendezvousServer> create(boost::asio::io_context& io, ServerLimits limits = {});
  void adopt(boost::asio::ip::tcp::socket socket, std::string already_read);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // From now on every connection must prove it holds `key` (auth.hpp)
  // before anything it sends is acted on; set before the first connection.
  void require_auth(auth::Key key) { key_ = std::make_shared<const auth::Key>(std::move(key)); }
  // A new key for connections from now on (musterd's reload). Connections
  // made before keep what they were accepted with; the key it replaces is
  // still accepted from new connections until the next rotation, so agents
  // can move to the new key one by one (docs/operations.md).
  void rotate_key(auth::Key key) {
    previous_key_ = key_;
    key_ = std::make_shared<const auth::Key>(std::move(key));
  }
  bool requires_auth() const { return key_ != nullptr; }
  // The static backend's node rank 0 serves the rendezvous and is a member of
  // it: its rank in `job` belongs to `node_name` from the start. The server
  // hands the reservation to the job when it opens it; the rule itself is the
  // core's (Rendezvous::reserve_node_rank). Set before the first connection.
  void reserve_node_rank(std::string job, int node_rank, std::string node_name) {
    reserved_ = JobReservation{std::move(job), ReservedRank{node_rank, std::move(node_name)}};
  }

  int port() const { return sessions_.port(); }
  std::size_t jobs() const { return jobs_.size(); }
  std::size_t tombstones() const { return tombstones_.size(); }
  std::size_t connections() const { return sessions_.size(); }
  ServerStats stats() const;
  // One job as `musterctl job` sums it up (a finished one while remembered);
  // nullopt for a job the server does not know.
  std::optional<JobSummary> job_summary(const std::string& id) const;
  void close();

 private:
  class Session;
  struct Job;
  struct Tombstone {
    bool success = false;
    TimePoint expires{};
    // What `musterctl jobs` shows of a finished job (its age from `created`).
    TimePoint created{};
    JobSummary summary;
    // A failed job's root cause, its message cut to kTombstoneMessage bytes.
    std::optional<FailureInfo> failure;
    std::string failure_node;
    TimePoint failure_at{};
  };
  static constexpr std::size_t kTombstoneMessage = 256;
  struct JobReservation {
    std::string job;
    ReservedRank rank;  // handed to the job when it opens
  };
  RendezvousServer(boost::asio::io_context& io, ServerLimits limits);
  void add_session(boost::asio::ip::tcp::socket socket, std::string already_read);
  void handle(Session& s, const std::string& payload);
  void handshake(Session& s, const std::string& payload);
  void answer_jobs(Session& s, const nlohmann::json& msg);
  // The one place a job's summary is made: an open job's as of now, a
  // finished one's as it ended (its age as of now).
  static JobSummary summarize(const Job& job, TimePoint now);
  static JobSummary summarize(const std::string& id, const Tombstone& t, TimePoint now);
  void answer_job(Session& s, const nlohmann::json& msg);
  // musterctl stacks: orders to the job's agents that can take their stacks.
  void answer_stacks(Session& s, const nlohmann::json& msg);
  void not_found(Session& s, const std::string& text);
  // A node's failing health check (`health`): noted for musterctl job.
  void note_health(Session& s, const nlohmann::json& msg);
  void handle_join(Session& s, const nlohmann::json& msg);
  void deliver(Job& job, const std::vector<Output>& outputs);
  void rearm(Job& job, bool full = false);
  void arm(Job& job, TimePoint at);
  // A job's timer fired `late`: the loop was behind; forgive, count, say so.
  void behind(Job& job, Duration late, TimePoint now);
  void retire_if_closed(Job& job);
  void expire_tombstones(TimePoint now);
  void gone(Session& s);
  void count_rejected(Rejection reason) { ++rejected_[static_cast<std::size_t>(reason)]; }

  boost::asio::io_context& io_;
  ServerLimits limits_;
  std::shared_ptr<const auth::Key> key_;
  std::shared_ptr<const auth::Key> previous_key_;
  std::optional<JobReservation> reserved_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  // Node-based, so the expiry queue can point into it: each id is held once.
  std::map<std::string, Tombstone> tombstones_;
  std::deque<std::map<std::string, Tombstone>::iterator> tombstone_order_;  // oldest first
  std::unordered_map<std::string, std::size_t> per_peer_;
  Counters retired_;  // the counters of jobs no longer held
  std::array<uint64_t, std::size(kRejections)> rejected_{};
  uint64_t behind_ = 0;
  double behind_seconds_ = 0;
  std::optional<TimePoint> behind_said_;
  HealthBoard health_;
  uint64_t health_reports_ = 0;
  // The sessions, which hold its alive flag: a session woken after close()
  // (its coroutine may outlive the server) sees it false and leaves the server alone.
  net::SessionServer<Session> sessions_;
};

}  // namespace muster::rendezvous
