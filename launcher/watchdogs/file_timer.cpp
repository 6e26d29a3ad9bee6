#include "file_timer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>

#include "muster/common/log.hpp"
#include "muster/common/text.hpp"
#include "signals.hpp"

namespace muster::launcher {

using nlohmann::json;

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Requests beyond this many malformed ones are counted, not logged.
constexpr std::uint64_t kLoggedBadRequests = 10;

}  // namespace

Result<TimerRequest> parse_timer_request(std::string_view line) {
  if (line.size() > kMaxTimerRequestBytes) {
    return invalid_argument("a timer request of " + std::to_string(line.size()) + " bytes (at most " +
                            std::to_string(kMaxTimerRequestBytes) + ")");
  }
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("a timer request that is not a JSON object");
  auto integer = [&](const char* name, long long lo, long long hi, long long& out) -> Status {
    auto it = j.find(name);
    if (it == j.end()) return invalid_argument(std::string("a timer request without \"") + name + "\"");
    if (!it->is_number_integer()) return invalid_argument(std::string("\"") + name + "\" is not an integer");
    bool in_range = it->is_number_unsigned()
                        ? it->get<unsigned long long>() <= static_cast<unsigned long long>(hi) &&
                              (lo <= 0 || it->get<unsigned long long>() >= static_cast<unsigned long long>(lo))
                        : it->get<long long>() >= lo && it->get<long long>() <= hi;
    if (!in_range) {
      return invalid_argument(std::string("\"") + name + "\" is out of range");
    }
    out = it->get<long long>();
    return {};
  };
  TimerRequest r;
  long long pid = 0;
  long long signo = 0;
  if (auto st = integer("pid", 1, INT_MAX, pid); !st.ok()) return st;
  // torch: a signal <= 0 expires the timer without killing.
  if (auto st = integer("signal", INT_MIN, SIGRTMAX, signo); !st.ok()) return st;
  auto scope = j.find("scope_id");
  if (scope == j.end() || !scope->is_string()) return invalid_argument("\"scope_id\" is missing or not a string");
  auto exp = j.find("expiration_time");
  if (exp == j.end() || !exp->is_number() || !std::isfinite(exp->get<double>())) {
    return invalid_argument("\"expiration_time\" is missing or not a finite number");
  }
  r.pid = static_cast<pid_t>(pid);
  r.signal = static_cast<int>(signo);
  r.scope_id = scope->get<std::string>();
  r.expiration_time = exp->get<double>();
  return r;
}

bool FileTimerTable::apply(const TimerRequest& r) {
  auto key = std::make_pair(r.pid, r.scope_id);
  auto it = timers_.find(key);
  if (r.expiration_time < 0) {
    if (it != timers_.end()) erase(it);
    return true;
  }
  if (it != timers_.end()) {
    expirations_.erase(expirations_.find(it->second.expiration_time));
    expirations_.insert(r.expiration_time);
    it->second = {r.expiration_time, r.signal};
    return true;
  }
  if (timers_.size() >= kMaxTimers || scope_bytes_ + r.scope_id.size() > kMaxTimerScopeBytes) return false;
  scope_bytes_ += r.scope_id.size();
  expirations_.insert(r.expiration_time);
  timers_.emplace(std::move(key), Timer{r.expiration_time, r.signal});
  return true;
}

FileTimerTable::Map::iterator FileTimerTable::erase(Map::iterator it) {
  scope_bytes_ -= it->first.second.size();
  expirations_.erase(expirations_.find(it->second.expiration_time));
  return timers_.erase(it);
}

std::vector<ExpiredWorker> FileTimerTable::take_expired(double now) {
  struct Expired {
    double at;
    int signal;
    std::string scope;
  };
  std::map<pid_t, std::vector<Expired>> by_pid;
  if (expirations_.empty() || *expirations_.begin() > now) return {};
  for (auto it = timers_.begin(); it != timers_.end();) {
    if (it->second.expiration_time <= now) {
      by_pid[it->first.first].push_back({it->second.expiration_time, it->second.signal, it->first.second});
      it = erase(it);
    } else {
      ++it;
    }
  }
  std::vector<ExpiredWorker> out;
  for (auto& [pid, expired] : by_pid) {
    std::stable_sort(expired.begin(), expired.end(), [](const Expired& a, const Expired& b) { return a.at < b.at; });
    ExpiredWorker w;
    w.pid = pid;
    for (auto& t : expired) {
      if (w.signal == 0 && t.signal > 0) w.signal = t.signal;
      w.scopes.push_back(std::move(t.scope));
    }
    // A reaped worker's other timers go with it (torch clears them too).
    if (w.signal > 0) forget(pid);
    out.push_back(std::move(w));
  }
  return out;
}

std::optional<double> FileTimerTable::next_expiration() const {
  if (expirations_.empty()) return std::nullopt;
  return *expirations_.begin();
}

void FileTimerTable::forget(pid_t pid) {
  for (auto it = timers_.lower_bound({pid, std::string()}); it != timers_.end() && it->first.first == pid;) {
    it = erase(it);
  }
}

FileTimerServer::FileTimerServer(boost::asio::io_context& io, std::string path, OnExpired on_expired)
    : path_(std::move(path)), on_expired_(std::move(on_expired)), pipe_(io), timer_(io) {}

Result<std::unique_ptr<FileTimerServer>> FileTimerServer::open(boost::asio::io_context& io, const std::string& path,
                                                               OnExpired on_expired) {
  auto fail = [&](const std::string& what) {
    return Status(Code::io_error, "cannot serve the worker watchdog's pipe TORCHELASTIC_TIMER_FILE=" + path + ": " +
                                      what + ": " + std::strerror(errno) +
                                      "; set TORCHELASTIC_TIMER_FILE to a path in a writable folder");
  };
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      errno = EISDIR;
      return fail("it is a directory");
    }
    if (unlink(path.c_str()) != 0) return fail("cannot remove what is there");
  }
  if (mkfifo(path.c_str(), 0600) != 0) return fail("mkfifo");
  // Read end first (non-blocking: no writer needed), then our own writer, so a
  // read finds the pipe open while no worker has it open.
  net::UniqueFd rd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!rd) {
    auto st2 = fail("open for reading");
    unlink(path.c_str());
    return st2;
  }
  net::UniqueFd wr(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!wr) {
    auto st2 = fail("open for writing");
    unlink(path.c_str());
    return st2;
  }
  std::unique_ptr<FileTimerServer> server(new FileTimerServer(io, path, std::move(on_expired)));
  struct stat made{};
  if (fstat(rd.get(), &made) == 0) {
    server->dev_ = made.st_dev;
    server->ino_ = made.st_ino;
  }
  server->pipe_.assign(rd.get());  // may throw: rd still owns it then
  (void)rd.release();
  server->keep_open_fd_ = std::move(wr);
  server->read();
  return server;
}

FileTimerServer::~FileTimerServer() {
  *alive_ = false;
  boost::system::error_code ignored;
  timer_.cancel();
  pipe_.close(ignored);
  keep_open_fd_.reset();
  // Another agent may have replaced the pipe at this path since: leave that one.
  struct stat now{};
  if (lstat(path_.c_str(), &now) == 0 && now.st_dev == dev_ && now.st_ino == ino_) unlink(path_.c_str());
}

void FileTimerServer::clear() {
  table_.clear();
  timer_.cancel();
}

void FileTimerServer::read() {
  std::weak_ptr<bool> alive = alive_;
  pipe_.async_read_some(boost::asio::buffer(buf_), [this, alive](const boost::system::error_code& ec, std::size_t n) {
    if (alive.expired() || !*alive.lock()) return;
    if (ec == boost::asio::error::operation_aborted) return;
    if (ec) {
      // Our own writer keeps the pipe open, so this is not an end of file.
      log::error("the worker watchdog's pipe " + path_ + " failed: " + ec.message() +
                 "; timers are no longer read");
      return;
    }
    lines_.feed(std::string_view(buf_, n), [this](std::string_view line, bool complete) { on_line(line, complete); });
    arm();
    read();
  });
}

void FileTimerServer::bad_request(const std::string& why) {
  ++bad_requests_;
  if (bad_requests_ <= kLoggedBadRequests) {
    log::warning("worker watchdog: ignored " + why +
                 (bad_requests_ == kLoggedBadRequests ? " (further bad requests are ignored without a word)" : ""));
  }
}

void FileTimerServer::on_line(std::string_view line, bool complete) {
  if (!complete) {
    // A piece of an over-long line: refused once, and its rest (up to the
    // next newline) is no request either.
    if (!discarding_) bad_request("a timer request longer than " + std::to_string(kMaxTimerRequestBytes) + " bytes");
    discarding_ = true;
    return;
  }
  if (discarding_) {
    discarding_ = false;
    return;
  }
  if (line.empty()) return;
  auto r = parse_timer_request(line);
  if (!r.ok()) {
    bad_request(r.status().message());
    return;
  }
  if (on_request_) on_request_(r->pid);
  if (!table_.apply(r.value())) {
    bad_request("a timer for pid " + std::to_string(r->pid) + ": " + std::to_string(table_.size()) +
                " timers are held already (at most " + std::to_string(kMaxTimers) + ", and " +
                std::to_string(kMaxTimerScopeBytes) + " bytes of scope names)");
  }
}

void FileTimerServer::arm() {
  auto next = table_.next_expiration();
  if (!next) {
    timer_.cancel();
    return;
  }
  // Wall-clock deadlines: wait until then on the steady clock and look again
  // (a clock step at worst moves one check, never loses it).
  double wait = std::max(0.0, *next - wall_now());
  timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(wait, 3600.0))));
  std::weak_ptr<bool> alive = alive_;
  timer_.async_wait([this, alive](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !*alive.lock()) return;
    check();
  });
}

void FileTimerServer::check() {
  for (const auto& w : table_.take_expired(wall_now())) on_expired_(w);
  arm();
}

int expired_timer_owner(pid_t pid, pid_t sid, const std::vector<std::pair<int, pid_t>>& running) {
  for (const auto& [local_rank, worker] : running) {
    if (worker > 0 && (pid == worker || sid == worker)) return local_rank;
  }
  return -1;
}

std::optional<TimerKill> claim_expired_timer(const ExpiredWorker& w, const std::vector<std::pair<int, pid_t>>& running) {
  // The first scopes, printable: a scope is whatever a worker wrote.
  std::string scopes;
  constexpr std::size_t kScopesShown = 8;
  for (std::size_t i = 0; i < w.scopes.size() && i < kScopesShown; ++i) {
    scopes += (i ? ", " : "") + log_excerpt(w.scopes[i], 200);
  }
  if (w.scopes.size() > kScopesShown) scopes += " and " + std::to_string(w.scopes.size() - kScopesShown) + " more";
  net::UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, w.pid, 0)));
  const int local_rank = expired_timer_owner(w.pid, pidfd ? getsid(w.pid) : -1, running);
  const std::string timer = "worker watchdog: timer (" + scopes + ") of pid " + std::to_string(w.pid);
  if (local_rank < 0) {
    if (w.signal > 0) log::warning(timer + " expired, but that process is none of this agent's workers; not signalled");
    return std::nullopt;
  }
  if (w.signal <= 0) {
    log::warning(timer + " (local_rank " + std::to_string(local_rank) + ") expired; it asked not to be killed");
    return std::nullopt;
  }
  return TimerKill{w, local_rank, std::move(scopes), std::move(pidfd)};
}

void send_timer_signal(const TimerKill& kill) {
  const ExpiredWorker& w = kill.worker;
  std::string name = signal_name(w.signal);
  log::warning("worker watchdog: timer (" + kill.scopes + ") of pid " + std::to_string(w.pid) + " (local_rank " +
               std::to_string(kill.local_rank) + ") expired; sending " + (name.empty() ? std::to_string(w.signal) : name));
  if (syscall(SYS_pidfd_send_signal, kill.pidfd.get(), w.signal, nullptr, 0) != 0 && errno != ESRCH) {
    log::error("worker watchdog: cannot signal pid " + std::to_string(w.pid) + ": " + std::strerror(errno));
  }
}

}  // namespace muster::launcher
