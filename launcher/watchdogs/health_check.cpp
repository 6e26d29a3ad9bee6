#include "health_check.hpp"

#include "muster/common/duration.hpp"
#include "muster/common/log.hpp"

namespace muster::launcher {

HealthCheck::HealthCheck(boost::asio::io_context& io, std::string command, std::chrono::milliseconds timeout,
                         std::map<std::string, std::string> env)
    : io_(io), command_(std::move(command)), timeout_(timeout), env_(std::move(env)), cooldown_timer_(io) {}

HealthCheck::~HealthCheck() {
  *alive_ = false;
  cancel();
}

void HealthCheck::cancel() {
  ++generation_;
  then_ = nullptr;
  cooldown_timer_.cancel();
  if (run_) run_->abandon();
  run_.reset();
}

void HealthCheck::then_join(const std::string& reason, std::function<void()> then) {
  reason_ = reason;
  const bool under_way = then_ != nullptr;
  then_ = std::move(then);
  if (!under_way) attempt();
}

void HealthCheck::check_now(std::function<void(bool passed)> done) {
  if (run_ || then_) return;
  reason_ = "periodic";
  run_once("while its workers ran, so this node leaves the job (the others go on without it, uncounted) and joins "
           "again once its check passes",
           std::move(done));
}

void HealthCheck::attempt() {
  run_once(std::string("before ") + (reason_ == "rejoin" ? "rejoining" : "joining") +
               " the rendezvous, so this node stays out of the job; trying again in " +
               seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(cooldown_)),
           [this](bool passed) {
             if (passed) {
               auto then = std::move(then_);
               then_ = nullptr;
               if (then) then();
               return;
             }
             std::weak_ptr<bool> alive = alive_;
             cooldown_timer_.expires_after(cooldown_);
             cooldown_ = std::min(cooldown_ * 2, kHealthCooldownMax);
             cooldown_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
               if (!ec && !alive.expired() && then_) attempt();
             });
           });
}

void HealthCheck::run_once(const std::string& consequence, std::function<void(bool)> on_result) {
  ChildRun::Spec spec;
  spec.argv = {"/bin/sh", "-c", command_};
  std::vector<std::string> envp;
  auto env = env_;
  env["MUSTER_HEALTH_CHECK_REASON"] = reason_;
  for (const auto& [k, v] : env) envp.push_back(k + "=" + v);
  spec.envp = std::move(envp);
  spec.limit = timeout_;
  spec.max_output = kHealthOutputShown;
  spec.keep = ChildRun::Keep::tail;
  std::weak_ptr<bool> alive = alive_;
  // A run replaced or cancelled since is no longer heard.
  if (run_) run_->abandon();
  const uint64_t generation = ++generation_;
  run_ = ChildRun::start(io_, std::move(spec), [this, alive, generation, consequence, on_result](ChildRun::Outcome o) {
    if (alive.expired() || generation != generation_ || !run_) return;
    run_.reset();
    if (o.ok()) {
      if (!healthy_) log::warning("health check passed; joining the rendezvous");
      healthy_ = true;
      cooldown_ = kHealthCooldownFirst;
      return on_result(true);
    }
    healthy_ = false;
    ++failures_;
    std::string how = o.timed_out ? "did not finish within --health-check-timeout " + seconds_text(timeout_)
                                  : o.started && o.exit_code == 127 ? "exit 127: the shell could not run it"
                                                                    : o.how();
    std::string output = o.output;
    while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
    log::error("health check failed (" + how + ") " + consequence +
               (output.empty() ? std::string(" (it wrote nothing)")
                               : std::string("; its output") + (o.output_cut ? " (the end)" : "") + ":\n" + output));
    if (on_failed_) {
      // The last lines say most: what the check found wrong.
      constexpr std::size_t kShown = 160;
      std::string tail = output.size() > kShown ? output.substr(output.size() - kShown) : output;
      const bool periodic = reason_ == "periodic";
      on_failed_({failures_, how + (tail.empty() ? std::string() : ": " + tail),
                  periodic ? std::chrono::milliseconds(0)
                           : std::chrono::duration_cast<std::chrono::milliseconds>(cooldown_)});
      if (alive.expired() || generation != generation_) return;
    }
    on_result(false);
  });
}

}  // namespace muster::launcher
