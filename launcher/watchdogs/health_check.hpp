// The node's health check (--health-check=CMD): a command the agent runs
// through /bin/sh -c before every join of the rendezvous (the first and each
// rejoin; a resume after a broken connection is not a join), bounded by
// --health-check-timeout (a check that hangs has failed), as a ChildRun that
// dies with the agent and never blocks its loop. A node whose check fails
// does not join: the agent logs the exit status and the tail of the output,
// and tries again after a cooldown that doubles from kHealthCooldownFirst up
// to kHealthCooldownMax. docs/failures.md, "Health checks".
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "child_run.hpp"

namespace muster::launcher {

constexpr std::chrono::seconds kHealthCooldownFirst{5};
constexpr std::chrono::seconds kHealthCooldownMax{300};
// The tail of a failed check's output that is logged.
constexpr std::size_t kHealthOutputShown = 4096;

class HealthCheck {
 public:
  // env: the agent's environment plus the node's facts (MUSTER_NODE_ADDRESS, ...).
  HealthCheck(boost::asio::io_context& io, std::string command, std::chrono::milliseconds timeout,
              std::map<std::string, std::string> env);
  ~HealthCheck();
  HealthCheck(const HealthCheck&) = delete;
  HealthCheck& operator=(const HealthCheck&) = delete;

  // Runs the check (reason: "first_join" or "rejoin", in
  // MUSTER_HEALTH_CHECK_REASON) until it passes, waiting the cooldown between
  // tries, then calls `then` on the loop. A call while one is under way
  // replaces its `then`.
  void then_join(const std::string& reason, std::function<void()> then);
  // Runs the check once while the workers run (reason "periodic") and calls
  // done(passed) on the loop; a failure is logged as the node leaving the
  // job. Ignored while a run is under way.
  void check_now(std::function<void(bool passed)> done);
  void cancel();
  // Told of every failed run, after it is logged: the failures so far, how
  // it failed with the end of its output, and when the next run is (0: the
  // agent decides, as after a periodic check).
  struct Failed {
    uint64_t failures = 0;
    std::string detail;
    std::chrono::milliseconds retry_in{0};
  };
  void on_failed(std::function<void(const Failed&)> listener) { on_failed_ = std::move(listener); }

  // For the metrics: whether the last run passed (true before any), failed runs.
  bool healthy() const { return healthy_; }
  uint64_t failures() const { return failures_; }

 private:
  void attempt();
  // One run of the check; on_result(passed) after the outcome is recorded
  // and, for a failure, logged with `consequence`.
  void run_once(const std::string& consequence, std::function<void(bool)> on_result);

  boost::asio::io_context& io_;
  std::string command_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, std::string> env_;
  boost::asio::steady_timer cooldown_timer_;
  std::shared_ptr<ChildRun> run_;
  std::function<void()> then_;
  std::function<void(const Failed&)> on_failed_;
  std::string reason_;
  std::chrono::seconds cooldown_ = kHealthCooldownFirst;
  bool healthy_ = true;
  uint64_t failures_ = 0;
  uint64_t generation_ = 0;  // of the run whose outcome is awaited
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
