#include "fanout.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <csignal>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "async_writer.hpp"
#include "launch_channel.hpp"
#include "line_splitter.hpp"
#include "muster/common/endpoint.hpp"
#include "muster/common/log.hpp"
#include "muster/common/version.hpp"
#include "muster/net/unique_fd.hpp"
#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/server.hpp"
#include "rendezvous_host.hpp"
#include "signal_source.hpp"
#include "signals.hpp"

namespace muster::launcher {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// One output pipe of an ssh session.
struct Stream {
  Stream(asio::io_context& io, bool err) : fd(io), is_stderr(err) {}
  asio::posix::stream_descriptor fd;
  LineSplitter lines;
  std::array<char, 16384> buf{};
  bool open = false;
  bool is_stderr;
};

// One host's ssh session: the child, its three pipes, what it said.
struct Session {
  Session(asio::io_context& io, RemoteHost h)
      : host(std::move(h)), in(io), exit_watch(io), out(io, false), err(io, true) {}
  enum class State { waiting, connecting, ready, ended };
  RemoteHost host;
  State state = State::waiting;
  pid_t pid = -1;
  asio::posix::stream_descriptor in, exit_watch;
  Stream out, err;
  std::deque<std::string> err_tail;
  std::deque<std::string> to_send;  // channel lines not written yet
  bool writing = false;
  std::optional<int> exit_code;  // the child's, once reaped (128+N for a signal)
  Clock::time_point started{};
  Clock::time_point exited_at{};
  bool first_line_seen = false;
  bool left_out = false;  // an elastic job went on without it
};

class Fanout {
 public:
  Fanout(asio::io_context& io, FanoutConfig fc, SignalSource& signals)
      : io_(io),
        fc_(std::move(fc)),
        signals_(signals),
        writer_(io, [](const std::string&, int) {}),
        tick_(io),
        stop_timer_(io),
        grace_timer_(io) {
    out_ = writer_.add_borrowed(STDOUT_FILENO, "stdout");
    err_ = writer_.add_borrowed(STDERR_FILENO, "stderr");
  }

  int run();

 private:
  void say(const std::string& text) { writer_.push(err_, "muster: " + text + "\n"); }
  Status open_rendezvous();
  void start_more();
  void spawn(Session& s);
  void read(Session& s, Stream& stream);
  void watch_exit(Session& s);
  void send(Session& s, std::string line);
  void flush(Session& s);
  void on_ready(Session& s);
  void maybe_ended(Session& s);
  void on_ended(Session& s);
  void stop_all(int signo, const std::string& why);
  void kill_sessions(int signo);
  void on_tick();
  void wait_signal();
  bool all_ended() const;
  std::string tail_of(const Session& s) const;

  asio::io_context& io_;
  FanoutConfig fc_;
  SignalSource& signals_;
  AsyncWriter writer_;
  AsyncWriter::Sink out_, err_;
  asio::steady_timer tick_, stop_timer_, grace_timer_;
  std::vector<std::unique_ptr<Session>> sessions_;
  std::size_t next_ = 0;
  int connecting_ = 0;
  int ready_count_ = 0;
  Clock::time_point began_ = Clock::now();
  std::unique_ptr<rendezvous::RendezvousServer> server_;
  std::unique_ptr<RendezvousHost> host_;
  std::string endpoint_for_agents_;
  std::optional<std::string> key_hex_;
  std::string rdzv_conf_;
  std::string key_file_;  // the job's key for musterctl, removed at the end
  bool stopping_ = false;
  bool stopped_by_signal_ = false;
  int kills_ = 0;
  bool failed_ = false;
  std::vector<std::string> failures_;
  std::vector<std::string> left_out_;  // hosts an elastic job went on without
};

// The job's key in a file only this user can read, for musterctl; "" when
// none could be written (the job runs the same, and says so).
std::string write_key_file(const std::string& job, const std::string& key) {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  std::string dir = std::string(runtime && *runtime ? runtime : "/tmp") + "/muster-" + std::to_string(getuid());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return {};
  struct stat st{};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
    return {};
  }
  bool plain = !job.empty() && job.size() < 128 && std::all_of(job.begin(), job.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  }) && job.front() != '.';
  std::string path = dir + "/" + (plain ? job : std::string("job")) + "." + std::to_string(getpid()) + ".key";
  net::UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return {};
  std::string text = key + "\n";
  if (write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    unlink(path.c_str());
    return {};
  }
  return path;
}

Status Fanout::open_rendezvous() {
  // The key is 64 hex digits: text that a key file holds as it is.
  auto random = rendezvous::auth::random_bytes(32);
  if (!random.ok()) return random.status();
  Result<std::string> key(rendezvous::auth::to_hex(random.value()));
  rdzv_conf_ = fc_.rdzv_conf;
  if (fc_.rdzv_endpoint.empty()) {
    // On every address, at a port of the system's choosing; each agent reaches
    // it at the address its ssh connection came from.
    auto server = rendezvous::RendezvousServer::listen(io_, "::", 0);
    if (!server.ok()) server = rendezvous::RendezvousServer::listen(io_, "0.0.0.0", 0);
    if (!server.ok()) return Status(Code::unavailable, "cannot serve the job's rendezvous: " + server.status().message());
    server_ = std::move(server.value());
    server_->require_auth(rendezvous::auth::Key(key.value()));
    endpoint_for_agents_ = ":" + std::to_string(server_->port());
  } else {
    auto ep = parse_endpoint(fc_.rdzv_endpoint, 29400);
    if (!ep.ok()) return ep.status();
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    host_ = std::make_unique<RendezvousHost>(io_, fc_.rdzv_id, rendezvous::auth::Key(key.value()));
    auto hosting = host_->open_c10d(*ep, NodeNames{name, std::nullopt}, std::nullopt);
    if (!hosting.ok()) return hosting.status();
    endpoint_for_agents_ = fc_.rdzv_endpoint;
    if (!hosting.value()) {
      host_.reset();
      log::info("the job's rendezvous is at " + fc_.rdzv_endpoint + " (not this host): its own key applies");
      return {};
    }
  }
  key_hex_ = rendezvous::auth::to_hex(key.value());
  if (rdzv_conf_.find("is_host=") == std::string::npos) rdzv_conf_ += (rdzv_conf_.empty() ? "" : ",") + std::string("is_host=false");
  const int port = server_ ? server_->port() : host_->port();
  log::info("the job's rendezvous runs in this command on port " + std::to_string(port) +
            ", authenticated with a key made for this job");
  key_file_ = write_key_file(fc_.rdzv_id, key.value());
  if (key_file_.empty()) {
    say("could not keep the job's key in a private file: musterctl cannot inspect this job");
  } else {
    say("job " + fc_.rdzv_id + " on " + std::to_string(fc_.hosts.size()) + " hosts; inspect it with: musterctl "
        "--endpoint=127.0.0.1:" + std::to_string(port) + " --auth-key-file=" + key_file_ + " job " + fc_.rdzv_id);
  }
  return {};
}

int Fanout::run() {
  if (auto st = open_rendezvous(); !st.ok()) {
    std::fprintf(stderr, "muster: error: %s\n", st.message().c_str());
    return 1;
  }
  for (const auto& src : fc_.export_sources) log::info("carried to every host: " + src);
  for (auto& h : fc_.hosts) sessions_.push_back(std::make_unique<Session>(io_, h));
  log::info("launching job " + fc_.rdzv_id + " on " + std::to_string(sessions_.size()) + " hosts over ssh (" +
            std::to_string(fc_.fanout) + " set up at a time)");
  wait_signal();
  start_more();
  on_tick();
  io_.run();
  if (!key_file_.empty()) unlink(key_file_.c_str());
  writer_.finish(std::chrono::seconds(std::max(1, fc_.shutdown_timeout)));
  bool all_ok = !stopped_by_signal_;
  for (const auto& s : sessions_) all_ok = all_ok && (s->left_out || (s->exit_code && *s->exit_code == 0));
  if (!failures_.empty()) {
    std::string text = "muster: the job failed on " + std::to_string(failures_.size()) + " of " +
                       std::to_string(sessions_.size()) + " hosts:\n";
    for (const auto& f : failures_) text += "  " + f + "\n";
    writer_.write_after_finish(err_, text);
  } else if (!left_out_.empty()) {
    std::string text = "muster: the job went on without " + std::to_string(left_out_.size()) + " of " +
                       std::to_string(sessions_.size()) + " hosts:\n";
    for (const auto& f : left_out_) text += "  " + f + "\n";
    writer_.write_after_finish(err_, text);
  }
  return all_ok && failures_.empty() ? 0 : 1;
}

void Fanout::wait_signal() {
  signals_.async_wait([this](int signo) {
    if (!stopping_) {
      say("received " + signal_name(signo) + ": stopping the job on every host");
      stop_all(signo, "");
    } else {
      say("received " + signal_name(signo) + " again: ending the ssh sessions now");
      kill_sessions(SIGTERM);
    }
    wait_signal();
  });
}

void Fanout::start_more() {
  while (!stopping_ && next_ < sessions_.size() && connecting_ < fc_.fanout) {
    spawn(*sessions_[next_++]);
  }
}

void Fanout::spawn(Session& s) {
  std::vector<std::string> agent_args = fc_.agent_args;
  agent_args.push_back("--nproc-per-node=" + s.host.nproc_per_node);
  if (!rdzv_conf_.empty()) agent_args.push_back("--rdzv-conf=" + rdzv_conf_);
  agent_args.push_back(std::string("--from-launcher=") + muster::version_string());
  for (const auto& c : fc_.command) agent_args.push_back(c);
  auto argv_text = ssh_argv(fc_, s.host, remote_command(fc_, agent_args));
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);

  channel::Header header;
  header.version = muster::version_string();
  header.order = s.host.order;
  header.rdzv_endpoint = endpoint_for_agents_;
  header.key_hex = key_hex_;
  header.env = fc_.exports;
  if (s.host.cuda_visible_devices) header.env["CUDA_VISIBLE_DEVICES"] = *s.host.cuda_visible_devices;

  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    failures_.push_back(s.host.entry.name + ": cannot make pipes: " + std::strerror(errno));
    s.state = Session::State::ended;
    s.exit_code = 1;
    stop_all(SIGTERM, "a host could not be started");
    return;
  }
  sigset_t all;
  sigfillset(&all);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // Its own process group: the terminal's signals reach the launching
    // command alone. It dies with the launching command.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(255);
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvp(argv[0], argv.data());
    const char* why = std::strerror(errno);
    (void)!write(2, "cannot run ", 11);
    (void)!write(2, argv[0], std::strlen(argv[0]));
    (void)!write(2, ": ", 2);
    (void)!write(2, why, std::strlen(why));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    close(in_pipe[1]);
    close(out_pipe[0]);
    close(err_pipe[0]);
    failures_.push_back(s.host.entry.name + ": cannot start ssh: " + std::strerror(errno));
    s.state = Session::State::ended;
    s.exit_code = 1;
    stop_all(SIGTERM, "a host could not be started");
    return;
  }
  setpgid(pid, pid);
  s.pid = pid;
  s.started = Clock::now();
  s.state = Session::State::connecting;
  ++connecting_;
  fcntl(in_pipe[1], F_SETFL, O_NONBLOCK);
  s.in.assign(in_pipe[1]);
  s.out.fd.assign(out_pipe[0]);
  s.err.fd.assign(err_pipe[0]);
  s.out.open = s.err.open = true;
  int pfd = pidfd_open(pid);
  if (pfd >= 0) s.exit_watch.assign(pfd);
  send(s, channel::encode_header(header));
  read(s, s.out);
  read(s, s.err);
  watch_exit(s);
}

void Fanout::send(Session& s, std::string line) {
  if (!s.in.is_open()) return;
  s.to_send.push_back(std::move(line));
  flush(s);
}

void Fanout::flush(Session& s) {
  if (s.writing || s.to_send.empty() || !s.in.is_open()) return;
  s.writing = true;
  asio::async_write(s.in, asio::buffer(s.to_send.front()), [this, &s](const boost::system::error_code& ec, std::size_t) {
    s.writing = false;
    if (ec) {
      boost::system::error_code ignore;
      s.in.close(ignore);
      s.to_send.clear();
      return;
    }
    s.to_send.pop_front();
    flush(s);
  });
}

// One of a session's output pipes, line by line: each line goes on whole,
// prefixed with its host; stdout's first line may be the agent's ready line,
// and stderr's last lines are kept to quote should the host fail.
void Fanout::read(Session& s, Stream& stream) {
  stream.fd.async_read_some(asio::buffer(stream.buf), [this, &s, &stream](const boost::system::error_code& ec,
                                                                          std::size_t n) {
    auto emit = [this, &s, &stream](std::string_view line, bool) {
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // ssh ends its own messages with CR LF
      if (!stream.is_stderr && !s.first_line_seen) {
        s.first_line_seen = true;
        if (line.rfind(channel::kReadyLine, 0) == 0) return on_ready(s);
      }
      std::string text = s.host.entry.name + ": ";
      text.append(line);
      text += "\n";
      writer_.push(stream.is_stderr ? err_ : out_, text);
      if (stream.is_stderr) {
        s.err_tail.emplace_back(line.substr(0, 400));
        if (s.err_tail.size() > kStderrTail) s.err_tail.pop_front();
      }
    };
    if (ec) {
      stream.lines.finish(emit);
      stream.open = false;
      return maybe_ended(s);
    }
    stream.lines.feed(std::string_view(stream.buf.data(), n), emit);
    read(s, stream);
  });
}

void Fanout::watch_exit(Session& s) {
  if (!s.exit_watch.is_open()) return;
  s.exit_watch.async_wait(asio::posix::stream_descriptor::wait_read, [this, &s](const boost::system::error_code& ec) {
    if (ec) return;
    int status = 0;
    if (waitpid(s.pid, &status, WNOHANG) != s.pid) return watch_exit(s);
    s.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    s.exited_at = Clock::now();
    boost::system::error_code ignore;
    s.exit_watch.close(ignore);
    maybe_ended(s);
  });
}

void Fanout::on_ready(Session& s) {
  if (s.state != Session::State::connecting) return;
  s.state = Session::State::ready;
  --connecting_;
  ++ready_count_;
  if (ready_count_ == static_cast<int>(sessions_.size())) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began_).count();
    log::info("the agents of all " + std::to_string(sessions_.size()) + " hosts are up (" + std::to_string(ms) +
              " ms after launch)");
  }
  start_more();
}

// A session ends when ssh has exited and both its pipes are drained (its last
// message is in hand); the tick closes pipes a stray holder keeps open.
void Fanout::maybe_ended(Session& s) {
  if (s.state == Session::State::ended || !s.exit_code || s.out.open || s.err.open) return;
  on_ended(s);
}

std::string Fanout::tail_of(const Session& s) const {
  std::string t;
  for (const auto& l : s.err_tail) t += (t.empty() ? "" : " | ") + l;
  return t.empty() ? "(it said nothing)" : t;
}

void Fanout::on_ended(Session& s) {
  const bool was_ready = s.state == Session::State::ready;
  if (s.state == Session::State::connecting) --connecting_;
  s.state = Session::State::ended;
  boost::system::error_code ignore;
  s.in.close(ignore);
  const int code = *s.exit_code;
  const std::string& name = s.host.entry.name;
  if (code != 0 && !(stopping_ && was_ready)) {
    std::string why;
    if (!was_ready && code == 255) {
      why = "ssh could not reach or log in to it: " + tail_of(s) +
            " (check that `ssh " + s.host.entry.target +
            " true` works without a password or a question: keys, known_hosts, MUSTER_SSH)";
    } else if (!was_ready && code == kExitNoDirectory) {
      why = "the working directory " + fc_.working_dir + " is missing there";
    } else if (!was_ready && code == kExitNoMuster) {
      why = "muster is not installed there (neither " + fc_.muster_path + " nor muster on PATH)";
    } else if (!was_ready) {
      why = "its muster did not start (exit " + std::to_string(code) + "): " + tail_of(s);
    } else if (code == 255) {
      why = "its ssh connection was lost: " + tail_of(s);
    } else {
      why = "its agent ended with exit code " + std::to_string(code);
    }
    bool counted = true;
    if (!stopping_) {
      // Was this the job's own end (a failure every agent learns of), or
      // this host leaving a job that goes on?
      std::optional<rendezvous::JobSummary> job;
      if (server_) job = server_->job_summary(fc_.rdzv_id);
      const bool job_ending = was_ready && code != 255 &&
                              (!server_ || (job && job->state != "forming" && job->state != "running"));
      int alive = 0;
      for (const auto& o : sessions_) alive += o->state != Session::State::ended ? 1 : 0;
      if (job_ending) {
        // The other agents were told by the rendezvous; they get their
        // shutdown grace period, and more, to end and say so.
        grace_timer_.expires_after(std::chrono::seconds(fc_.shutdown_timeout) + kEndingGrace);
        grace_timer_.async_wait([this](const boost::system::error_code& ec) {
          if (!ec && !all_ended()) stop_all(SIGTERM, "the other hosts did not end after the job failed");
        });
      } else if (fc_.min_nodes < fc_.max_nodes && alive >= fc_.min_nodes) {
        say("error: host " + name + ": " + why + "; the job goes on without it (hosts left: " + std::to_string(alive) +
            ", --nnodes allows " + std::to_string(fc_.min_nodes) + ")");
        counted = false;
        s.left_out = true;
        left_out_.push_back(name + ": " + why);
      } else {
        say("error: host " + name + ": " + why);
        stop_all(SIGTERM, "host " + name + " failed");
      }
    }
    if (counted) failures_.push_back(name + ": " + why);
  }
  start_more();
  if (all_ended()) {
    tick_.cancel();
    stop_timer_.cancel();
    grace_timer_.cancel();
    signals_.cancel();
    if (server_) server_->close();
    io_.stop();
  }
}

bool Fanout::all_ended() const {
  for (std::size_t i = 0; i < sessions_.size(); ++i) {
    const auto& s = sessions_[i];
    if (s->state == Session::State::ended) continue;
    if (s->state == Session::State::waiting && stopping_) continue;  // never started
    return false;
  }
  return true;
}

void Fanout::stop_all(int signo, const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  stopped_by_signal_ = why.empty();
  if (!why.empty()) say("stopping the job on every host: " + why);
  for (auto& s : sessions_) {
    if (s->state == Session::State::connecting || s->state == Session::State::ready) {
      send(*s, channel::encode(channel::record::Stop{signo}));
    }
  }
  // The agents stop their workers within --shutdown-timeout; past that and
  // some slack the sessions are ended from here.
  stop_timer_.expires_after(std::chrono::seconds(fc_.shutdown_timeout) + kStopSlack);
  stop_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    say("the hosts did not end within --shutdown-timeout and " + std::to_string(kStopSlack.count()) +
        " s: ending their ssh sessions");
    kill_sessions(SIGTERM);
  });
  if (all_ended()) {
    asio::post(io_, [this] {
      if (all_ended()) io_.stop();
    });
  }
}

void Fanout::kill_sessions(int signo) {
  for (auto& s : sessions_) {
    if (s->state != Session::State::ended && s->pid > 0) kill(-s->pid, signo);
  }
  if (++kills_ == 1) {
    stop_timer_.expires_after(std::chrono::seconds(5));
    stop_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) kill_sessions(SIGKILL);
    });
  }
}

void Fanout::on_tick() {
  const auto now = Clock::now();
  for (auto& s : sessions_) {
    if (s->state == Session::State::ready && !s->writing && s->to_send.empty()) {
      send(*s, channel::encode(channel::record::Heartbeat{}));
    }
    if (s->state == Session::State::connecting && now - s->started > kSetupLimit && s->pid > 0 && !stopping_) {
      s->err_tail.push_back("no answer from muster there within " + std::to_string(kSetupLimit.count()) + " s");
      kill(-s->pid, SIGTERM);
    }
    // ssh is gone but something else holds its pipes: stop waiting for them.
    if (s->state != Session::State::ended && s->exit_code && (s->out.open || s->err.open) &&
        now - s->exited_at > std::chrono::seconds(2)) {
      boost::system::error_code ignore;
      s->out.fd.cancel(ignore);
      s->err.fd.cancel(ignore);
    }
  }
  tick_.expires_after(channel::kHeartbeat);
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) on_tick();
  });
}

}  // namespace

int run_fanout(FanoutConfig fc, const Environment& env) {
  (void)env;
  asio::io_context io(1);
  std::vector<int> handled = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  auto signals = SignalSource::open(io, handled);
  if (!signals.ok()) {
    std::fprintf(stderr, "muster: error: %s\n", signals.status().message().c_str());
    return 1;
  }
  Fanout fanout(io, std::move(fc), *signals.value());
  return fanout.run();
}

}  // namespace muster::launcher
