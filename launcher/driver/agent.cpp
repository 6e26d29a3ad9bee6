#include "agent.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "exposure.hpp"
#include "failure_report.hpp"
#include "group_assignment.hpp"
#include "launch_channel.hpp"
#include "muster/common/text.hpp"
#include "muster/common/endpoint.hpp"
#include "muster/common/log.hpp"
#include "muster/net/unique_fd.hpp"
#include "signals.hpp"

namespace muster::launcher {
namespace {

// How long killed workers get to disappear before the agent stops waiting.
constexpr std::chrono::seconds kKilledWorkerWait{10};
// How long the stacks of a hung job may take before the kill goes ahead.
constexpr std::chrono::seconds kStackDumpLimit{10};

std::string signal_label(int signo) {
  std::string name = signal_name(signo);
  return name.empty() ? std::to_string(signo) : name;
}

}  // namespace

Agent::Agent(boost::asio::io_context& io, SignalSource& signals, LaunchConfig cfg, Environment env)
    : io_(io),
      signals_(signals),
      cfg_(std::move(cfg)),
      env_(std::move(env)),
      core_(cfg_.nproc_per_node, cfg_.max_restarts, cfg_.coordinated),
      writer_(io,
              [](const std::string& sink, int error) {
                log::error("cannot write to " + sink + ": " + std::strerror(error) +
                           "; the job goes on, and output to it is dropped from here on");
              }),
      console_sinks_{writer_.add_borrowed(STDOUT_FILENO, "the console (stdout)"),
                     writer_.add_borrowed(STDERR_FILENO, "the console (stderr)")},
      console_(writer_, console_sinks_.err),
      planner_(cfg_, writer_, console_sinks_),
      supervisor_(io, [this](const WorkerExit& e) { on_worker_exit(e); }),
      shutdown_timer_(io),
      health_timer_(io),
      exclusion_timer_(io),
      host_(local_fqdn()),
      reporter_(FailureReporter::Settings{cfg_.entrypoint_name, host_,
                                          env_.count("TORCHELASTIC_ERROR_FILE")
                                              ? std::optional<std::string>(env_.at("TORCHELASTIC_ERROR_FILE"))
                                              : std::nullopt,
                                          cfg_.worker_timeout, cfg_.one_report_per_job},
                [this](const std::string& text) { say(text); }),
      events_(cfg_, env_, host_, [this](const std::string& text) { say(text); }),
      store_host_(io, cfg_.coordinated ? StoreHost::Emptying::by_rounds : StoreHost::Emptying::each_attempt) {
  supervisor_.on_worker_pid([this](int, pid_t) { events_.pid_known(); });
  if (cfg_.worker_timeout.count() > 0) {
    worker_timeout_ = std::make_unique<WorkerTimeout>(
        io_, cfg_.worker_timeout,
        [this] {
          std::vector<std::pair<int, pid_t>> running;
          for (int lr : supervisor_.running()) running.emplace_back(lr, supervisor_.reported_pid(lr));
          return running;
        },
        [this](const std::vector<ProgressWatch::Silent>& silent) { on_workers_silent(silent); });
    WorkerTimeout* timeout = worker_timeout_.get();
    store_host_.watch({[timeout](store::ConnId conn, const boost::asio::ip::tcp::endpoint& peer,
                                 int port) { timeout->store_request(conn, peer, port); },
                       [timeout](store::ConnId conn, int port) { timeout->store_closed(conn, port); }});
  }
}

Agent::~Agent() = default;

int Agent::run() {
  const int code = run_job();
  // The output still queued gets the shutdown grace period the user gave (at
  // least a second, so --shutdown-timeout=0 does not cut a healthy run's last
  // lines), no more; what a console nobody reads did not take is dropped, and said.
  const auto left = writer_.finish(std::chrono::seconds(std::max(1, cfg_.shutdown_timeout)));
  if (!left.dropped.empty()) {
    std::string list;
    for (const auto& d : left.dropped) {
      list += (list.empty() ? "" : ", ") + std::to_string(d.bytes) + " bytes for " + d.name;
    }
    say("muster: at exit, output that was not taken within --shutdown-timeout=" +
        std::to_string(cfg_.shutdown_timeout) + " s was dropped: " + list + "\n");
  }
  return code;
}

void Agent::attach_launcher(net::UniqueFd channel, std::chrono::milliseconds silence) {
  launcher_ = std::make_unique<LauncherLink>(io_, std::move(channel), silence,
                                             [this](int signo, const std::string&) { on_signal(signo); });
  launcher_->start();
}

int Agent::fail_start_up(const Status& st) {
  say("muster: error: " + st.message() + "\n");
  events_.agent_failed(st.message());
  return 1;
}

int Agent::run_job() {
  rendezvous_began_ = std::chrono::steady_clock::now();
  wait_for_signal();
  if (auto st = open_file_timer(); !st.ok()) return fail_start_up(st);
  if (core_.coordinated()) return run_coordinated();
  if (auto st = form_group(); !st.ok()) return fail_start_up(st);
  events_.set_executable(planner_.executable_path());
  open_stack_dump();
  if (log::enabled(log::Level::info)) {
    log::info("[" + cfg_.role + "] Rendezvous complete for workers. Result:\n  restart_count=0\n  master_addr=" +
              group_.master_addr + "\n  master_port=" + std::to_string(group_.master_port) +
              "\n  group_rank=0\n  group_world_size=1\n  local_world_size=" + std::to_string(cfg_.nproc_per_node));
  }
  // A signal that arrived during start-up is pending in the signalfd: handle
  // it before any worker starts.
  io_.poll();
  if (!finished()) {
    join_when_healthy("first_join", [this] { apply(core_.start()); });
    if (!finished()) io_.run();
  }
  return core_.exit_code().value_or(1);
}

void Agent::open_health_check() {
  if (!health_) {
    std::map<std::string, std::string> env(env_.begin(), env_.end());
    env["MUSTER_NODE_ADDRESS"] = cfg_.local_addr ? *cfg_.local_addr : host_;
    env["MUSTER_RDZV_ID"] = cfg_.rdzv_id;
    env["MUSTER_ROLE"] = cfg_.role;
    env["MUSTER_LOCAL_WORLD_SIZE"] = std::to_string(cfg_.nproc_per_node);
    health_ = std::make_unique<HealthCheck>(io_, cfg_.health_check, cfg_.health_check_timeout, std::move(env));
    // In a job through a rendezvous, musterctl job shows the node that stays out.
    health_->on_failed([this](const HealthCheck::Failed& f) {
      if (member_ && !finished()) member_->report_health(f.failures, f.detail, f.retry_in, cfg_.health_check_timeout);
    });
  }
}

void Agent::join_when_healthy(const std::string& reason, std::function<void()> join) {
  if (cfg_.health_check.empty()) return join();
  open_health_check();
  health_->then_join(reason, [this, join = std::move(join)] {
    if (!finished()) join();
  });
}

// --health-check-interval: while this node's workers run in a job through a
// rendezvous, its check runs every interval; a failure takes the node out of
// the job (RendezvousMember::step_out), and it joins again once the check
// passes (join_when_healthy, with its cooldown).
void Agent::arm_health_timer() {
  if (cfg_.health_check_interval.count() <= 0 || cfg_.health_check.empty() || !member_) return;
  health_timer_.expires_after(cfg_.health_check_interval);
  health_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || finished() || core_.phase() != Phase::running) return;  // a new attempt arms it again
    open_health_check();
    health_->check_now([this](bool passed) {
      if (finished() || core_.phase() != Phase::running) return;
      if (passed) return arm_health_timer();
      member_->step_out("its health check failed while its workers ran");
    });
  });
}

Status Agent::form_group() {
  std::string master_addr;
  int wanted_port = 0;
  if (cfg_.rdzv_backend == "static") {
    // config_from_args checked the node rank (0 of one) and that the endpoint has a port.
    auto ep = parse_endpoint(cfg_.rdzv_endpoint, -1);
    if (!ep.ok()) return ep.status();
    master_addr = strip_brackets(ep->host);
    wanted_port = ep->port;
  } else {
    master_addr = cfg_.local_addr ? *cfg_.local_addr : host_;
  }
  group_ = one_node_group(cfg_, env_, master_addr, wanted_port);
  if (group_.use_agent_store) {
    // The workers reach it at MASTER_ADDR: only there, when that is an address of this machine.
    if (auto st = store_host_.serve(listen_address_for(group_.master_addr), wanted_port); !st.ok()) {
      return Status(Code::unavailable, "cannot serve the workers' store on TCP port " + std::to_string(wanted_port) +
                                           " (MASTER_PORT): " + st.message() + "; pick a free one with --master-port");
    }
  } else if (auto st = store_host_.reserve(wanted_port); !st.ok()) {
    return st;
  }
  group_.master_port = store_host_.port();
  return planner_.resolve_executable(env_);
}

Status Agent::open_file_timer() {
  if (cfg_.file_timer_path.empty()) return {};
  auto server = FileTimerServer::open(io_, cfg_.file_timer_path, [this](const ExpiredWorker& w) {
    std::vector<std::pair<int, pid_t>> running;
    for (int lr : supervisor_.running()) running.emplace_back(lr, supervisor_.reported_pid(lr));
    auto claimed = claim_expired_timer(w, running);
    if (!claimed) return;
    auto kill = std::make_shared<TimerKill>(std::move(*claimed));
    if (member_) member_->report_hung(group_.base_global_rank + kill->local_rank);
    take_stacks_then([kill] { send_timer_signal(*kill); });
  });
  if (!server.ok()) return server.status();
  file_timer_ = std::move(server.value());
  if (worker_timeout_) file_timer_->on_request([this](pid_t pid) { worker_timeout_->timer_request(pid); });
  // The workers find the pipe here (torchrun passes it on the same way).
  env_["TORCHELASTIC_TIMER_FILE"] = cfg_.file_timer_path;
  log::info("worker watchdog: serving timers on " + cfg_.file_timer_path);
  return {};
}

void Agent::on_workers_silent(const std::vector<ProgressWatch::Silent>& all_silent) {
  if (core_.phase() != Phase::running) return;  // stopping already: not a hang
  // A --run-path worker whose script is done waits, quietly, for its peers: not hung.
  std::vector<ProgressWatch::Silent> silent;
  for (const auto& s : all_silent) {
    if (!planner_.finished_run_path_script(group_.base_global_rank + s.local_rank)) silent.push_back(s);
  }
  if (silent.empty()) return;
  log::error(hang_text(silent, group_.base_global_rank, [this](int lr) { return supervisor_.reported_pid(lr); },
                       cfg_.worker_timeout));
  // The kill is for these workers of this attempt: by the time the stacks
  // are taken the group may have stopped, or restarted with new ones.
  std::map<int, pid_t> pids;
  for (const auto& s : silent) pids[s.local_rank] = supervisor_.reported_pid(s.local_rank);
  // The other nodes' workers wait for it in a collective now: their stacks
  // show where (the rendezvous asks them), taken while this node's are.
  if (member_) member_->report_hung(group_.base_global_rank + silent.front().local_rank);
  const int attempt = core_.groups_started();
  take_stacks_then([this, silent, pids, attempt] {
    if (core_.groups_started() == attempt) kill_hung(silent, pids);
  });
}

void Agent::kill_hung(const std::vector<ProgressWatch::Silent>& silent, const std::map<int, pid_t>& pids) {
  if (core_.phase() != Phase::running) return;  // the group stopped while the stacks were taken
  const auto running = supervisor_.running();
  std::vector<ProgressWatch::Silent> still;
  for (const auto& s : silent) {
    const bool runs = std::find(running.begin(), running.end(), s.local_rank) != running.end();
    if (runs && supervisor_.reported_pid(s.local_rank) == pids.at(s.local_rank)) still.push_back(s);
  }
  for (const auto& s : still) {
    reporter_.hung(s.local_rank, s.silent_for);
    supervisor_.signal_one(s.local_rank, SIGKILL);
    counters_.failed();
  }
  // Failed from now on, whether or not its exit ever comes: the group stops
  // within the shutdown timeout either way.
  for (const auto& s : still) apply(core_.on_worker_hung(s.local_rank));
}

// py-spy for the stacks of a hung job: MUSTER_PY_SPY (a path; empty: none),
// else on PATH, else beside the workers' Python. Only with a watchdog (a
// request from the rendezvous finds it when it comes).
void Agent::open_stack_dump() {
  if (cfg_.worker_timeout.count() <= 0 && cfg_.file_timer_path.empty()) return;
  find_py_spy();
}

void Agent::find_py_spy() {
  if (stacks_) return;
  std::string program;
  if (auto forced = env_.find("MUSTER_PY_SPY"); forced != env_.end()) {
    program = forced->second;
  } else if (auto on_path = resolve_executable("py-spy", env_or(env_, "PATH", "")); on_path.ok()) {
    program = on_path.value();
  } else {
    const std::string& exe = planner_.executable_path();
    std::string beside = exe.substr(0, exe.find_last_of('/') + 1) + "py-spy";
    if (exe.find('/') != std::string::npos && ::access(beside.c_str(), X_OK) == 0) program = beside;
  }
  stacks_ = std::make_unique<StackDump>(io_, program, kStackDumpLimit);
}

namespace {
constexpr const char* kNoPySpy =
    "py-spy is not on PATH or beside the workers' Python, so the workers' Python stacks cannot be taken; install "
    "it (pip install py-spy) in the job's environment, or name it with MUSTER_PY_SPY";
}  // namespace

void Agent::take_stacks_then(std::function<void()> then) {
  if (!stacks_ || !stacks_->available()) {
    if (stacks_ && !stacks_hint_said_) {
      stacks_hint_said_ = true;
      log::warning(std::string("worker watchdog: ") + kNoPySpy);
    }
    then();
    return;
  }
  // A dump under way covers this hang too: its kill waits for it.
  after_stacks_.push_back(std::move(then));
  if (stacks_->running()) return;
  start_dump("worker watchdog: Python stacks", true);
}

void Agent::take_requested_stacks(const std::string& reason) {
  if (finished()) return;
  if (core_.phase() != Phase::running) {
    log::info("[" + cfg_.role + "] the rendezvous asked for the workers' stacks (" + log_excerpt(reason, 500) +
              "), but no workers run on this node");
    return;
  }
  find_py_spy();
  if (!stacks_->available()) {
    if (!stacks_hint_said_) {
      stacks_hint_said_ = true;
      log::warning("[" + cfg_.role + "] the rendezvous asked for the workers' stacks (" + log_excerpt(reason, 500) +
                   "): " + kNoPySpy);
    }
    return;
  }
  if (stacks_->running()) return;  // the dump under way answers it
  log::warning("[" + cfg_.role + "] the rendezvous asks for the workers' Python stacks: " + log_excerpt(reason, 500));
  start_dump("Python stacks (" + log_excerpt(reason, 500) + ")", false);
}

void Agent::start_dump(const std::string& title, bool for_report) {
  std::vector<StackDump::Target> targets;
  for (int lr : supervisor_.running()) {
    pid_t pid = supervisor_.reported_pid(lr);
    if (pid > 0) targets.push_back({lr, group_.base_global_rank + lr, pid});
  }
  const bool started = stacks_->dump(std::move(targets), [this, dir = attempt_dir_, title, for_report](
                                                              std::vector<StackDump::Stack> stacks) {
    // A watchdog's kill that waited for this dump makes it the hang's report.
    if (!finished()) record_stacks(stacks, dir, title, for_report || !after_stacks_.empty());
    // The kills that waited go first (a file timer's own signal), then the
    // stop held for the dump; a hang's kill finds the group stopping already
    // and leaves it to that stop.
    const auto held = core_.on_stacks_done();
    auto waiting = std::move(after_stacks_);
    after_stacks_.clear();
    for (auto& then : waiting) {
      if (!finished()) then();
    }
    if (!finished()) apply(held);
  });
  if (started) apply(core_.on_stacks_started());
}

// Into the log, and with --log-dir into <attempt>/<local_rank>/stacks.txt.
void Agent::record_stacks(const std::vector<StackDump::Stack>& stacks, const std::string& attempt_dir,
                          const std::string& heading, bool for_report) {
  std::vector<std::string> files;
  for (const auto& s : stacks) {
    const std::string title = heading + " of rank " + std::to_string(s.target.global_rank) + " (local_rank " +
                              std::to_string(s.target.local_rank) + ", pid " + std::to_string(s.target.pid) +
                              "), by " + stacks_->program() + " dump (" + s.how_it_ended + ")";
    log::error(title + ":\n" + s.text);
    if (attempt_dir.empty()) continue;
    const std::string path = attempt_dir + "/" + std::to_string(s.target.local_rank) + "/stacks.txt";
    net::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!fd) {
      log::warning("cannot write " + path + ": " + std::strerror(errno));
      continue;
    }
    auto sink = writer_.add_owned(std::move(fd), path);
    writer_.push(sink, title + "\n" + s.text);
    writer_.release(sink);
    files.push_back(path);
  }
  if (!for_report) return;
  stacks_where_ = files.empty() ? "in the log above"
                                : "in the log above and in " + attempt_dir + "/<local_rank>/stacks.txt";
}

AgentMetrics Agent::metrics() const {
  AgentMetrics m;
  switch (core_.phase()) {
    case Phase::idle: m.phase = "idle"; break;
    case Phase::running: m.phase = "running"; break;
    case Phase::stopping: m.phase = "stopping"; break;
    case Phase::waiting: m.phase = "waiting"; break;
    case Phase::finished: m.phase = "finished"; break;
  }
  m.local_world_size = cfg_.nproc_per_node;
  m.workers_running = static_cast<int>(supervisor_.running().size());
  m.restart_count = group_.restart_count;
  m.max_restarts = cfg_.max_restarts;
  m.worker_group_starts = static_cast<uint64_t>(core_.groups_started());
  m.worker_failures = counters_.worker_failures;
  m.log_lines_dropped = console_.dropped_total();
  for (const auto& [lr, code] : counters_.last_exitcodes) m.last_exits.push_back({lr, code});
  m.health_check = health_ != nullptr;
  m.healthy = !health_ || health_->healthy();
  m.health_check_failures = health_ ? health_->failures() : 0;
  m.coordinated = core_.coordinated();
  m.rendezvous_connected = member_ && member_->connected();
  m.assigned = member_ && member_->assigned();
  m.round = member_ ? member_->round() : -1;
  m.group_rank = group_.group_rank;
  m.group_world_size = group_.group_world_size;
  m.world_size = group_.global_world_size;
  return m;
}

void Agent::wait_for_signal() {
  signals_.async_wait([this](int signo) {
    if (finished()) return;
    on_signal(signo);
    wait_for_signal();
  });
}

void Agent::on_signal(int signo) {
  if (finished()) return;
  log::warning("Received " + signal_label(signo) + " death signal, shutting down workers");
  // Out of the job before its workers are stopped: the other nodes' workers
  // fail on the collectives this node's stop breaks, and the rendezvous must
  // already know why (a departure re-forms the job, uncounted), whichever
  // reaches it first.
  if (member_) member_->leave();
  apply(core_.on_signal(signo));
}

// The core puts Finish last in its list and answers nothing once finished,
// so every action of a list is performed, and nothing after Finish.
void Agent::apply(const std::vector<Action>& actions) {
  for (const auto& a : actions) {
    if (const auto* start = std::get_if<action::StartWorkers>(&a)) {
      start_workers(start->restart_count);
    } else if (const auto* failed = std::get_if<action::AnnounceRestart>(&a)) {
      log::warning("[" + cfg_.role + "] Worker group FAILED. " + std::to_string(failed->attempts_left) + "/" +
                   std::to_string(failed->max_restarts) + " attempts left; will restart worker group");
    } else if (const auto* sig = std::get_if<action::SignalWorkers>(&a)) {
      last_stop_signal_ = sig->signo;
      if (!stop_sent_at_) stop_sent_at_ = std::chrono::system_clock::now();
      for (int lr : supervisor_.running()) {
        log::warning("Sending process " + std::to_string(supervisor_.worker_pid(lr)) + " closing signal " +
                     signal_label(sig->signo));
      }
      supervisor_.signal_all(sig->signo);
    } else if (const auto* arm = std::get_if<action::ArmShutdownTimer>(&a)) {
      shutdown_timer_.expires_after(arm->after_kill ? kKilledWorkerWait : std::chrono::seconds(cfg_.shutdown_timeout));
      shutdown_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (!ec) apply(core_.on_shutdown_timer());
      });
    } else if (std::holds_alternative<action::CancelShutdownTimer>(a)) {
      shutdown_timer_.cancel();
    } else if (std::holds_alternative<action::KillWorkers>(a)) {
      for (int lr : supervisor_.running()) {
        log::warning("Unable to shutdown process " + std::to_string(supervisor_.worker_pid(lr)) + " via " +
                     signal_label(last_stop_signal_) + ", forcefully exiting via SIGKILL");
      }
      supervisor_.signal_all(SIGKILL);
    } else if (std::holds_alternative<action::AbandonWorkers>(a)) {
      for (int lr : supervisor_.running()) {
        log::error("process " + std::to_string(supervisor_.worker_pid(lr)) + " (local_rank " + std::to_string(lr) +
                   ") is still there " + std::to_string(kKilledWorkerWait.count()) +
                   " s after SIGKILL, probably stuck in the kernel (state D); giving up on it");
      }
    } else if (std::holds_alternative<action::HoldStop>(a)) {
      log::warning("[" + cfg_.role + "] stopping the workers once their Python stacks, being taken now, are written " +
                   "(at most " + std::to_string(kStackDumpLimit.count()) + " s)");
    } else if (const auto* rf = std::get_if<action::ReportFailure>(&a)) {
      report_to_rendezvous_failure(rf->local_rank);
    } else if (std::holds_alternative<action::ReportSuccess>(a)) {
      member_->report_success();
    } else if (std::holds_alternative<action::Rejoin>(a)) {
      // Workers down after a restart order or a fence: join for the next round
      // (now, or once the connection is back), once the node's check passes.
      if (auto wait = member_->take_exclusion_wait()) {
        // Excluded: the cooldown first, then the check, then back as a spare.
        exclusion_timer_.expires_after(*wait);
        exclusion_timer_.async_wait([this](const boost::system::error_code& ec) {
          if (ec || finished()) return;
          log::info("[" + cfg_.role + "] this node's exclusion is over; joining the job again");
          join_when_healthy("rejoin", [this] { member_->rejoin(); });
        });
        continue;
      }
      join_when_healthy("rejoin", [this] { member_->rejoin(); });
    } else if (std::holds_alternative<action::Finish>(a)) {
      finish();
      return;
    }
  }
}

void Agent::start_workers(int restart_count) {
  // One node's restart has no rendezvous: it begins as the workers are down, now.
  if (restart_count > 0) rendezvous_began_ = std::chrono::steady_clock::now();
  const auto rendezvous_began = member_ ? member_->join_sent_at() : rendezvous_began_;
  reporter_.start_attempt(group_.base_global_rank);
  stop_sent_at_.reset();
  group_.restart_count = restart_count;
  auto attempt = planner_.prepare_attempt(restart_count, env_);
  if (!attempt.ok()) {
    log::error(attempt.status().message());
    apply(core_.on_start_failed());
    return;
  }
  attempt_dir_ = attempt.value();
  // torch times its rendezvous and its rank assignment before every start.
  events_.rendezvous_done(restart_count, rendezvous_began);
  const auto assign_began = std::chrono::steady_clock::now();
  auto planned = planner_.launches(env_, group_, attempt.value(), worker_timeout_.get());
  events_.ranks_assigned(group_, assign_began);
  if (!planned.ok()) {
    log::error(planned.status().message());
    apply(core_.on_start_failed());
    return;
  }
  std::vector<WorkerLaunch> launches;
  for (auto& w : planned.value()) {
    reporter_.set_error_file(w.launch.local_rank, w.error_file);
    launches.push_back(std::move(w.launch));
  }
  store_host_.attempt_starting();
  if (file_timer_) file_timer_->clear();
  if (auto st = supervisor_.start(launches); !st.ok()) {
    log::error(st.message());
    apply(core_.on_start_failed());
    return;
  }
  if (worker_timeout_) worker_timeout_->start(static_cast<int>(launches.size()));
  arm_health_timer();
  events_.workers_started(group_, [this](int lr) {
    const WorkerExit* e = reporter_.exit_of(lr);
    return e ? e->pid : supervisor_.reported_pid(lr);
  });
}

void Agent::on_worker_exit(const WorkerExit& e) {
  // A signal that reached the agent before this exit was seen comes first:
  // the worker may have been hit by the same scancel or kill.
  if (auto signo = signals_.take_pending()) on_signal(*signo);
  if (finished()) return;
  reporter_.exited(e);
  if (file_timer_) file_timer_->forget(e.pid);
  if (worker_timeout_) worker_timeout_->exited(e.local_rank);
  counters_.exited(e.local_rank, e.status.torch_exitcode());
  if (!e.status.success() && core_.phase() == Phase::running) {
    counters_.failed();
    log::error("failed (exitcode: " + std::to_string(e.status.torch_exitcode()) +
               ") local_rank: " + std::to_string(e.local_rank) + " (pid: " + std::to_string(e.pid) + ") of " +
               (cfg_.run_path ? "fn: run_script_path (start_method: " + cfg_.start_method + ")"
                              : "binary: " + (cfg_.python_from_path ? planner_.executable_path() : cfg_.executable)));
  }
  apply(core_.on_worker_exit(e.local_rank, e.status, !stop_sent_at_ || e.when < *stop_sent_at_));
}

// The core's Finish: the report it chose, then the loop's end.
void Agent::finish() {
  if (launcher_) launcher_->close();
  if (worker_timeout_) worker_timeout_->stop();
  if (health_) health_->cancel();
  health_timer_.cancel();
  exclusion_timer_.cancel();
  shutdown_timer_.cancel();
  signals_.cancel();
  if (member_) member_->leave();
  console_.ending();
  auto last_pid = [this](int lr) {
    const WorkerExit* e = reporter_.exit_of(lr);
    return e ? e->pid : supervisor_.worker_pid(lr);
  };
  events_.run_ended(core_, reporter_, last_pid);
  auto pid_of = [this](int lr) { return supervisor_.worker_pid(lr); };
  switch (core_.final_report()) {
    case FinalReport::signal:
      say("SignalException: Process " + std::to_string(getpid()) +
          " got signal: " + std::to_string(*core_.received_signal()) + "\n");
      break;
    case FinalReport::job:
      reporter_.report_job(*job_root_cause_, core_.failures(), member_->address(), group_.group_rank,
                           core_.groups_started() > 0, pid_of);
      break;
    case FinalReport::local:
      reporter_.report_local(core_.failures(), pid_of);
      break;
    case FinalReport::none:
      // Workers the agent stopped (an order, a lost rendezvous) are victims:
      // the error that stopped them was said when it happened.
      if (core_.exit_code() == 0) log::info("[" + cfg_.role + "] worker group successfully finished.");
      break;
  }
  // Outside torch's report: where the stacks of a hang went.
  if (!stacks_where_.empty() && core_.exit_code() != 0) {
    say("muster: the Python stacks of every worker when one was taken for hung are " + stacks_where_ + "\n");
  }
  planner_.finish();
  io_.stop();
}

}  // namespace muster::launcher
