#include "agent.hpp"
#include "exposure.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>


#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "failure_report.hpp"
#include "macros.hpp"
#include "muster/common/endpoint.hpp"
#include "muster/common/duration.hpp"
#include "muster/common/log.hpp"
#include "muster/net/unique_fd.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "muster/rendezvous/rank_assignment.hpp"
#include "signals.hpp"
#include "muster/common/text.hpp"

namespace muster::launcher {
namespace {

// How long killed workers get to disappear before the agent stops waiting.
constexpr std::chrono::seconds kKilledWorkerWait{10};

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
      core_(cfg_.nproc_per_node, cfg_.max_restarts, cfg_.max_nodes > 1),
      writer_(io,
              [](const std::string& sink, int error) {
                log::error("cannot write to " + sink + ": " + std::strerror(error) +
                           "; the job goes on, and output to it is dropped from here on");
              }),
      planner_(cfg_, writer_),
      supervisor_(io, [this](const WorkerExit& e) { on_worker_exit(e); }),
      shutdown_timer_(io),
      host_(local_fqdn()),
      reporter_(FailureReporter::Settings{cfg_.entrypoint_name, host_,
                                          env_.count("TORCHELASTIC_ERROR_FILE")
                                              ? std::optional<std::string>(env_.at("TORCHELASTIC_ERROR_FILE"))
                                              : std::nullopt,
                                          cfg_.worker_timeout, cfg_.one_report_per_job},
                [this](const std::string& text) { say(text); }),
      store_host_(io) {
  // torch's event loggers run at LOGLEVEL, INFO when it is unset; events are
  // recorded at INFO.
  std::string level = env_or(env_, "LOGLEVEL", "INFO");
  for (auto& c : level) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  events_ = cfg_.event_log_handler == "console" && (level == "INFO" || level == "DEBUG" || level == "NOTSET");
  supervisor_.on_worker_pid([this](int, pid_t) { emit_start_events_when_known(); });
  if (cfg_.worker_timeout.count() > 0) {
    worker_timeout_ = std::make_unique<WorkerTimeout>(
        io_, cfg_.worker_timeout,
        [this] {
          std::vector<std::pair<int, pid_t>> running;
          for (int lr : supervisor_.running()) running.emplace_back(lr, supervisor_.reported_pid(lr));
          return running;
        },
        [this](const std::vector<ProgressWatch::Silent>& silent) { on_workers_silent(silent); });
  }
  if (worker_timeout_) {
    WorkerTimeout* timeout = worker_timeout_.get();
    store_host_.watch({[timeout](store::ConnId conn, const boost::asio::ip::tcp::endpoint& peer,
                                 int port) { timeout->store_request(conn, peer, port); },
                       [timeout](store::ConnId conn, int port) { timeout->store_closed(conn, port); }});
  }
  writer_.add(STDOUT_FILENO, "the console (stdout)", false);
  writer_.add(STDERR_FILENO, "the console (stderr)", false);
  // While stderr is full the agent's own log lines are dropped (and counted),
  // so a console nobody reads cannot make the agent's memory grow.
  log::set_writer([this](std::string_view line) {
    if (writer_.full(STDERR_FILENO)) {
      ++dropped_log_lines_;
      ++dropped_log_lines_total_;
      return;
    }
    if (dropped_log_lines_ > 0) {
      writer_.push(STDERR_FILENO, "muster: " + std::to_string(dropped_log_lines_) +
                                      " log lines were dropped while stderr was not being read\n");
      dropped_log_lines_ = 0;
    }
    writer_.push(STDERR_FILENO, line);
  });
}

Agent::~Agent() { log::set_writer(nullptr); }

void Agent::say(const std::string& text) { writer_.push(STDERR_FILENO, text); }

Status Agent::form_group() {
  // One node: this agent is group rank 0 of a group of one.
  rendezvous::NodeSlot self{cfg_.role, cfg_.nproc_per_node};
  auto ranks = rendezvous::assign_worker_ranks({self}).front();
  group_.role = cfg_.role;
  group_.group_rank = 0;
  group_.group_world_size = 1;
  group_.local_world_size = cfg_.nproc_per_node;
  group_.base_global_rank = ranks.base_global_rank;
  group_.global_world_size = ranks.global_world_size;
  group_.base_role_rank = ranks.base_role_rank;
  group_.role_world_size = ranks.role_world_size;
  group_.run_id = cfg_.rdzv_id;
  group_.max_restarts = cfg_.max_restarts;
  // The agent serves the workers' store at MASTER_ADDR:MASTER_PORT, as torch
  // 2.x's agent does, so a worker's death never takes the store down. With
  // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (c10d only, as in torchrun) worker 0
  // hosts it instead, on a port the agent holds until the workers start.
  group_.use_agent_store =
      cfg_.rdzv_backend == "static" || env_or(env_, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "") != "1";

  int wanted_port = 0;
  if (cfg_.rdzv_backend == "static") {
    // config_from_args checked the node rank (0 of one) and that the endpoint has a port.
    auto ep = parse_endpoint(cfg_.rdzv_endpoint, -1);
    if (!ep.ok()) return ep.status();
    group_.master_addr = strip_brackets(ep->host);
    wanted_port = ep->port;
  } else {
    group_.master_addr = cfg_.local_addr ? *cfg_.local_addr : local_fqdn();
  }
  if (group_.use_agent_store) {
    // The workers reach it at MASTER_ADDR: only there, when that is an address of this machine.
    if (auto st = store_host_.serve(listen_address_for(group_.master_addr), wanted_port); !st.ok()) {
      return Status(Code::unavailable, "cannot serve the workers' store on TCP port " + std::to_string(wanted_port) +
                                           " (MASTER_PORT): " + st.message() + "; pick a free one with --master-port");
    }
  } else {
    if (auto st = store_host_.reserve(wanted_port); !st.ok()) return st;
  }
  group_.master_port = store_host_.port();

  return planner_.resolve_executable(env_);
}

Status Agent::open_file_timer() {
  if (cfg_.file_timer_path.empty()) return {};
  auto server = FileTimerServer::open(io_, cfg_.file_timer_path, [this](const ExpiredWorker& w) { on_timer_expired(w); });
  if (!server.ok()) return server.status();
  file_timer_ = std::move(server.value());
  if (worker_timeout_) file_timer_->on_request([this](pid_t pid) { worker_timeout_->timer_request(pid); });
  // The workers find the pipe here (torchrun passes it on the same way).
  env_["TORCHELASTIC_TIMER_FILE"] = cfg_.file_timer_path;
  log::info("worker watchdog: serving timers on " + cfg_.file_timer_path);
  return {};
}

void Agent::on_workers_silent(const std::vector<ProgressWatch::Silent>& all_silent) {
  if (finished_ || core_.phase() != Phase::running) return;  // stopping already: not a hang
  // A --run-path worker whose script is done waits, quietly, for its peers: not hung.
  std::vector<ProgressWatch::Silent> silent;
  for (const auto& s : all_silent) {
    if (!planner_.finished_run_path_script(group_.base_global_rank + s.local_rank)) silent.push_back(s);
  }
  if (silent.empty()) return;
  std::string list;
  for (const auto& s : silent) {
    list += (list.empty() ? "" : "; ") + std::string("rank ") +
            std::to_string(group_.base_global_rank + s.local_rank) + " (local_rank " + std::to_string(s.local_rank) +
            ", pid " + std::to_string(supervisor_.reported_pid(s.local_rank)) + ") silent for " +
            seconds_text(s.silent_for);
  }
  log::error("worker watchdog: " + list + ": no output on stdout or stderr, no store request and no file-timer " +
             "request within --worker-timeout " + seconds_text(cfg_.worker_timeout) +
             "; taking it for hung: sending SIGKILL");
  for (const auto& s : silent) {
    reporter_.hung(s.local_rank, s.silent_for);
    supervisor_.signal_one(s.local_rank, SIGKILL);
    ++worker_failures_;
  }
  // Failed from now on, whether or not its exit ever comes: the group stops
  // within the shutdown timeout either way.
  for (const auto& s : silent) {
    if (finished_) break;
    apply(core_.on_worker_hung(s.local_rank));
  }
}


void Agent::on_timer_expired(const ExpiredWorker& w) {
  // The first scopes, printable: a scope is whatever a worker wrote.
  std::string scopes;
  constexpr std::size_t kScopesShown = 8;
  for (std::size_t i = 0; i < w.scopes.size() && i < kScopesShown; ++i) {
    scopes += (i ? ", " : "") + log_excerpt(w.scopes[i], 200);
  }
  if (w.scopes.size() > kScopesShown) scopes += " and " + std::to_string(w.scopes.size() - kScopesShown) + " more";
  // Only this agent's workers and what they started without leaving the
  // worker's session (the worker is its session's leader): a request naming
  // any other process is ignored. The process is held by a pidfd from the
  // check to the signal, so a pid reused in between is never signalled.
  net::UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, w.pid, 0)));
  int local_rank = -1;
  pid_t sid = pidfd ? getsid(w.pid) : -1;
  for (int lr : supervisor_.running()) {
    pid_t worker = supervisor_.reported_pid(lr);
    if (worker > 0 && (w.pid == worker || sid == worker)) local_rank = lr;
  }
  if (local_rank < 0) {
    if (w.signal > 0) {
      log::warning("worker watchdog: timer (" + scopes + ") of pid " + std::to_string(w.pid) +
                   " expired, but that process is none of this agent's workers; not signalled");
    }
    return;
  }
  if (w.signal <= 0) {
    log::warning("worker watchdog: timer (" + scopes + ") of pid " + std::to_string(w.pid) + " (local_rank " +
                 std::to_string(local_rank) + ") expired; it asked not to be killed");
    return;
  }
  log::warning("worker watchdog: timer (" + scopes + ") of pid " + std::to_string(w.pid) + " (local_rank " +
               std::to_string(local_rank) + ") expired; sending " + signal_label(w.signal));
  if (syscall(SYS_pidfd_send_signal, pidfd.get(), w.signal, nullptr, 0) != 0 && errno != ESRCH) {
    log::error("worker watchdog: cannot signal pid " + std::to_string(w.pid) + ": " + std::strerror(errno));
  }
}

int Agent::run() {
  run_started_ = rendezvous_started_ = std::chrono::steady_clock::now();
  wait_for_signal();
  if (auto st = open_file_timer(); !st.ok()) {
    say("muster: error: " + st.message() + "\n");
    if (events_) emit_event("FAILED", "AGENT", nullptr, st.message(), std::nullopt);
    return 1;
  }
  if (cfg_.max_nodes > 1) return run_coordinated();
  if (auto st = form_group(); !st.ok()) {
    std::string msg = "muster: error: " + st.message() + "\n";
    say(msg);
    if (events_) emit_event("FAILED", "AGENT", nullptr, st.message(), std::nullopt);
    return 1;
  }
  if (log::enabled(log::Level::info)) {
    log::info("[" + cfg_.role + "] Rendezvous complete for workers. Result:\n  restart_count=0\n  master_addr=" +
              group_.master_addr + "\n  master_port=" + std::to_string(group_.master_port) +
              "\n  group_rank=0\n  group_world_size=1\n  local_world_size=" + std::to_string(cfg_.nproc_per_node));
  }
  // A signal that arrived during start-up is pending in the signalfd: handle
  // it before any worker starts.
  io_.poll();
  if (finished_) return exit_code_;
  apply(core_.start());
  if (!finished_) io_.run();
  return exit_code_;
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
  m.worker_group_starts = worker_group_starts_;
  m.worker_failures = worker_failures_;
  m.log_lines_dropped = dropped_log_lines_total_;
  for (const auto& [lr, e] : last_exits_) m.last_exits.push_back(e);
  m.coordinated = coordinated_;
  m.rendezvous_connected = member_ && member_->connected();
  m.assigned = member_ && member_->assigned();
  m.round = member_ ? member_->round() : -1;
  m.group_rank = group_.group_rank;
  m.group_world_size = group_.group_world_size;
  m.world_size = group_.global_world_size;
  return m;
}

void Agent::emit_event(const std::string& state, const std::string& source, const EventWorker* worker,
                       const std::optional<std::string>& raw_error, const std::optional<double>& duration_ms) {
  EventJob job;
  job.run_id = group_.run_id;
  job.role = cfg_.role;
  job.hostname = host_;
  job.rdzv_backend = cfg_.rdzv_backend;
  // torch: os.path.basename of the executable, or the function's name.
  const std::string& exe = planner_.executable_path();
  job.entry_point = cfg_.run_path ? "run_script_path" : exe.substr(exe.find_last_of('/') + 1);
  say(format_event(state, source, job, event_group_, worker, raw_error, duration_ms) + "\n");
}

EventWorker Agent::event_worker(int local_rank) const {
  EventWorker w;
  w.local_rank = local_rank;
  w.global_rank = group_.base_global_rank + local_rank;
  w.role_rank = group_.base_role_rank + local_rank;
  w.role_world_size = group_.role_world_size;
  return w;
}

// torch records each worker's START once all of them run, with its pid as its id.
void Agent::emit_start_events_when_known() {
  if (!start_events_pending_ || collecting_start_pids_) return;
  collecting_start_pids_ = true;
  std::vector<pid_t> pids;
  for (int lr = 0; lr < cfg_.nproc_per_node; ++lr) {
    const WorkerExit* e = reporter_.exit_of(lr);
    pids.push_back(e ? e->pid : supervisor_.reported_pid(lr));
  }
  collecting_start_pids_ = false;
  if (std::find(pids.begin(), pids.end(), 0) != pids.end()) return;
  start_events_pending_ = false;
  for (int lr = 0; lr < cfg_.nproc_per_node; ++lr) {
    EventWorker w = event_worker(lr);
    w.worker_id = std::to_string(pids[static_cast<std::size_t>(lr)]);
    emit_event("START", "WORKER", &w, std::nullopt, std::nullopt);
  }
}

// At the end, as torch's agent and launcher record it: each worker's outcome,
// then the agent's own. A signal (or a failure before any worker ran) is the
// agent's FAILED alone.
void Agent::emit_final_events(int exit_code) {
  emit_start_events_when_known();
  start_events_pending_ = false;  // a worker whose pid never came: no START for it
  event_group_.total_run_time =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - run_started_).count();
  if (core_.stopped_by_signal() && core_.received_signal()) {
    emit_event("FAILED", "AGENT", nullptr,
               "SignalException: Process " + std::to_string(getpid()) + " got signal: " +
                   std::to_string(*core_.received_signal()),
               std::nullopt);
    return;
  }
  if (worker_group_starts_ == 0) {
    emit_event("FAILED", "AGENT", nullptr, std::string("the workers could not be started"), std::nullopt);
    return;
  }
  std::map<int, const ObservedFailure*> failed;
  for (const auto& f : core_.failures()) failed[f.local_rank] = &f;
  // torch builds every failure before it records any, on one shared dictionary
  // for those without an error file: once one of them carries the errorTraits,
  // all of them do. So: a first pass that only learns that.
  for (const auto& [lr, f] : failed) {
    failure_raw_error(reporter_.error_file(lr), f->status.torch_exitcode(), error_traits_added_);
  }
  for (int lr = 0; lr < cfg_.nproc_per_node; ++lr) {
    EventWorker w = event_worker(lr);
    const WorkerExit* e = reporter_.exit_of(lr);
    pid_t pid = e ? e->pid : supervisor_.worker_pid(lr);
    w.worker_id = std::to_string(pid);
    auto f = failed.find(lr);
    if (f != failed.end()) {
      int code = f->second->status.torch_exitcode();
      w.exit_code = code;
      w.worker_pid = pid;
      emit_event("FAILED", "WORKER", &w, failure_raw_error(reporter_.error_file(lr), code, error_traits_added_), std::nullopt);
    } else {
      // A worker the agent stopped for another's failure (torch: TERMINATED).
      emit_event(exit_code == 0 ? "SUCCEEDED" : "TERMINATED", "WORKER", &w, std::nullopt, std::nullopt);
    }
  }
  emit_event("SUCCEEDED", "AGENT", nullptr, std::nullopt, std::nullopt);
}

void Agent::wait_for_signal() {
  signals_.async_wait([this](int signo) {
    if (finished_) return;
    on_signal(signo);
    wait_for_signal();
  });
}

void Agent::on_signal(int signo) {
  if (finished_) return;
  log::warning("Received " + signal_label(signo) + " death signal, shutting down workers");
  apply(core_.on_signal(signo));
}

void Agent::apply(const std::vector<Action>& actions) {
  for (const auto& a : actions) {
    if (finished_) return;
    if (const auto* start = std::get_if<action::StartWorkers>(&a)) {
      if (start->restart_count > 0) rendezvous_started_ = std::chrono::steady_clock::now();
      start_workers(start->restart_count);
    } else if (const auto* failed = std::get_if<action::AnnounceRestart>(&a)) {
      log::warning("[" + cfg_.role + "] Worker group FAILED. " + std::to_string(failed->attempts_left) + "/" +
                   std::to_string(failed->max_restarts) + " attempts left; will restart worker group");
    } else if (const auto* sig = std::get_if<action::SignalWorkers>(&a)) {
      last_stop_signal_ = sig->signo;
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
    } else if (const auto* rf = std::get_if<action::ReportFailure>(&a)) {
      report_to_rendezvous_failure(rf->local_rank);
    } else if (std::holds_alternative<action::ReportSuccess>(a)) {
      member_->report_success();
    } else if (std::holds_alternative<action::Rejoin>(a)) {
      // Workers down after a restart order or a fence: join for the next round
      // (now, or once the connection is back).
      member_->rejoin();
    } else if (const auto* fin = std::get_if<action::Finish>(&a)) {
      finish(fin->exit_code);
    }
  }
}

void Agent::start_workers(int restart_count) {
  reporter_.start_attempt(group_.base_global_rank);
  group_.restart_count = restart_count;
  auto attempt = planner_.prepare_attempt(restart_count, env_);
  if (!attempt.ok()) {
    log::error(attempt.status().message());
    finish(1);
    return;
  }
  auto now = std::chrono::steady_clock::now();
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  // torch times its rendezvous and its rank assignment before every start.
  event_group_.agent_restarts = restart_count;
  if (events_) emit_event("RENDEZVOUS", "AGENT", nullptr, std::nullopt, ms_since(member_ ? member_->join_sent_at() : rendezvous_started_));
  auto planned = planner_.launches(env_, group_, attempt.value(), worker_timeout_.get());
  if (events_) emit_event("ASSIGN_WORKER_RANKS", "AGENT", nullptr, std::nullopt, ms_since(now));
  event_group_.group_rank = group_.group_rank;
  event_group_.group_world_size = group_.group_world_size;
  if (!planned.ok()) {
    log::error(planned.status().message());
    finish(1);
    return;
  }
  std::vector<WorkerLaunch> launches;
  for (auto& w : planned.value()) {
    reporter_.set_error_file(w.launch.local_rank, w.error_file);
    launches.push_back(std::move(w.launch));
  }
  store_host_.release_reservation();
  // Every attempt starts with an empty store: nothing of the workers that
  // just died (their addresses, their barrier counts) can mislead the new ones.
  // (A multi-node job gets a fresh store per round when it joins instead: node
  // rank 0 starting its workers must not wipe what other nodes' workers wrote.)
  if (!coordinated_) store_host_.reset();
  if (file_timer_) file_timer_->clear();
  if (auto st = supervisor_.start(launches); !st.ok()) {
    log::error(st.message());
    finish(1);
    return;
  }
  if (worker_timeout_) worker_timeout_->start(static_cast<int>(launches.size()));
  ++worker_group_starts_;
  start_events_pending_ = events_;
  emit_start_events_when_known();
}

void Agent::on_worker_exit(const WorkerExit& e) {
  // A signal that reached the agent before this exit was seen comes first:
  // the worker may have been hit by the same scancel or kill.
  if (auto signo = signals_.take_pending()) on_signal(*signo);
  if (finished_) return;
  reporter_.exited(e);
  if (file_timer_) file_timer_->forget(e.pid);
  if (worker_timeout_) worker_timeout_->exited(e.local_rank);
  last_exits_[e.local_rank] = {e.local_rank, e.status.torch_exitcode()};
  if (!e.status.success() && core_.phase() == Phase::running) {
    ++worker_failures_;
    log::error("failed (exitcode: " + std::to_string(e.status.torch_exitcode()) +
               ") local_rank: " + std::to_string(e.local_rank) + " (pid: " + std::to_string(e.pid) + ") of " +
               (cfg_.run_path ? "fn: run_script_path (start_method: " + cfg_.start_method + ")"
                              : "binary: " + (cfg_.python_from_path ? planner_.executable_path() : cfg_.executable)));
  }
  apply(core_.on_worker_exit(e.local_rank, e.status));
}

void Agent::finish(int exit_code) {
  if (finished_) return;
  finished_ = true;
  exit_code_ = exit_code;
  if (worker_timeout_) worker_timeout_->stop();
  shutdown_timer_.cancel();
  signals_.cancel();
  if (member_) member_->leave();
  if (events_) emit_final_events(exit_code);
  bool root_is_local = false;
  for (const auto& f : core_.failures()) root_is_local = root_is_local || !f.stopped_by_agent;
  if (exit_code != 0) {
    if (core_.stopped_by_signal() && core_.received_signal()) {
      std::string msg = "SignalException: Process " + std::to_string(getpid()) +
                        " got signal: " + std::to_string(*core_.received_signal()) + "\n";
      say(msg);
    } else if (coordinated_ && job_root_cause_) {
      reporter_.report_job(*job_root_cause_, core_.failures(), member_->address(), group_.group_rank,
                           worker_group_starts_ > 0, [this](int lr) { return supervisor_.worker_pid(lr); });
    } else if (root_is_local) {
      // Workers the agent stopped (an order, a lost rendezvous) are victims:
      // the error that stopped them was said when it happened.
      reporter_.report_local(core_.failures(), [this](int lr) { return supervisor_.worker_pid(lr); });
    }
  } else {
    log::info("[" + cfg_.role + "] worker group successfully finished.");
  }
  planner_.finish();
  io_.stop();
}

}  // namespace muster::launcher
