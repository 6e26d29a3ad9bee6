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
#include "console_log.hpp"
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

constexpr std::size_t kReadChunk = 16384;

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// One output pipe of an ssh session.
struct Stream {
  Stream(asio::io_context& io, bool err) : fd(io), is_stderr(err) {}
  asio::posix::stream_descriptor fd;
  LineSplitter lines;
  std::vector<char> buf;  // allocated when the session starts
  bool open = false;
  bool is_stderr;
};

// One host's ssh session: the child, its three pipes, what it said.
struct Session {
  Session(asio::io_context& io, RemoteHost h)
      : host(std::move(h)), in(io), exit_watch(io), out(io, false), err(io, true), decide(io) {}
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
  bool ready_seen = false;
  std::optional<Clock::time_point> setup_killed;  // when the set-up limit's SIGTERM went
  bool left_out = false;  // an elastic job went on without it
  std::optional<std::string> pending_why;  // a failure not yet classified (decide())
  asio::steady_timer decide;
};

class Fanout {
 public:
  Fanout(asio::io_context& io, FanoutConfig fc, SignalSource& signals)
      : io_(io),
        fc_(std::move(fc)),
        signals_(signals),
        writer_(io, [](const std::string&, int) {}),
        out_(writer_.add_borrowed(STDOUT_FILENO, "stdout")),
        err_(writer_.add_borrowed(STDERR_FILENO, "stderr")),
        console_(writer_, err_),
        tick_(io),
        stop_timer_(io),
        grace_timer_(io) {
  }

  int run();

 private:
  void say(const std::string& text) { console_.say("muster: " + text + "\n"); }
  Status open_rendezvous();
  void start_more();
  void spawn(Session& s);
  void read(Session& s, Stream& stream);
  void watch_exit(Session& s);
  bool reap(Session& s);
  void decide(Session& s);
  void lost(Session& s, const std::string& why);
  int alive() const;
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
  // This command's log lines and messages go through the writer: a stderr
  // nobody reads never holds the loop (and with it the heartbeats).
  ConsoleLog console_;
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
  const std::string where = server_ ? "127.0.0.1:" + std::to_string(port) : fc_.rdzv_endpoint;
  log::info("the job's rendezvous runs in this command on port " + std::to_string(port) +
            ", authenticated with a key made for this job");
  key_file_ = write_key_file(fc_.rdzv_id, key.value());
  if (key_file_.empty()) {
    say("could not keep the job's key in a private file: musterctl cannot inspect this job");
  } else {
    say("job " + fc_.rdzv_id + " on " + std::to_string(fc_.hosts.size()) + " hosts; inspect it with: musterctl "
        "--endpoint=" + where + " --auth-key-file=" + key_file_ + " job " + fc_.rdzv_id);
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
  for (const auto& s : sessions_) {
    all_ok = all_ok && (s->left_out || (s->exit_code && *s->exit_code == 0));
    if (s->pending_why) failures_.push_back(s->host.entry.name + ": " + *s->pending_why);
  }
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

  const std::string header_line = channel::encode_header(header);

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
    // A session of its own: no controlling terminal, and a process group
    // the terminal's signals do not reach.
    setsid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(255);
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    // Nothing of this command's (the rendezvous's sockets) goes with it.
    syscall(SYS_close_range, 3U, ~0U, 0U);
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
  s.pid = pid;
  s.started = Clock::now();
  s.state = Session::State::connecting;
  ++connecting_;
  fcntl(in_pipe[1], F_SETFL, O_NONBLOCK);
  s.in.assign(in_pipe[1]);
  s.out.fd.assign(out_pipe[0]);
  s.err.fd.assign(err_pipe[0]);
  s.out.buf.resize(kReadChunk);
  s.err.buf.resize(kReadChunk);
  s.out.open = s.err.open = true;
  int pfd = pidfd_open(pid);
  if (pfd >= 0) s.exit_watch.assign(pfd);
  send(s, header_line);
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
      // What a login shell prints before muster starts comes first; the
      // agent's ready line is the first of its own.
      if (!stream.is_stderr && !s.ready_seen && line.rfind(channel::kReadyLine, 0) == 0) {
        s.ready_seen = true;
        return on_ready(s);
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
    // A console that does not keep up holds the pipe: ssh, and the host's
    // workers behind it, wait rather than this command's memory growing.
    const auto sink = stream.is_stderr ? err_ : out_;
    if (writer_.full(sink)) {
      writer_.when_room(sink, [this, &s, &stream] { read(s, stream); });
    } else {
      read(s, stream);
    }
  });
}

void Fanout::watch_exit(Session& s) {
  if (!s.exit_watch.is_open()) return;
  s.exit_watch.async_wait(asio::posix::stream_descriptor::wait_read, [this, &s](const boost::system::error_code& ec) {
    if (ec) return;
    if (!reap(s)) return watch_exit(s);
    boost::system::error_code ignore;
    s.exit_watch.close(ignore);
    maybe_ended(s);
  });
}

// Whether the session's ssh has exited (its status taken).
bool Fanout::reap(Session& s) {
  if (s.exit_code) return true;
  int status = 0;
  pid_t r = waitpid(s.pid, &status, WNOHANG);
  if (r == 0) return false;
  if (r == s.pid) {
    s.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  } else {
    s.exit_code = 255;  // gone, its status lost (ECHILD)
  }
  s.exited_at = Clock::now();
  return true;
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
  // What ends while the job is being stopped is the stop's doing.
  if (code != 0 && !stopping_) {
    std::string why;
    if (!was_ready && code == 255) {
      why = "ssh could not reach or log in to it: " + tail_of(s) + " (check that `ssh " + s.host.entry.target +
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
    if (was_ready && code != 255) {
      // The job's own failure, which every agent learns of from the
      // rendezvous, or this agent alone leaving a job that goes on: the
      // rendezvous may not have read its last word yet, so ask it shortly.
      s.pending_why = why;
      s.decide.expires_after(kDecideAfter);
      s.decide.async_wait([this, &s](const boost::system::error_code& ec) {
        if (!ec) decide(s);
      });
    } else {
      lost(s, why);
    }
  }
  start_more();
  if (all_ended()) {
    tick_.cancel();
    stop_timer_.cancel();
    grace_timer_.cancel();
    signals_.cancel();
    for (auto& o : sessions_) o->decide.cancel();
    if (server_) server_->close();
    io_.stop();
  }
}

int Fanout::alive() const {
  int n = 0;
  for (const auto& o : sessions_) n += o->state != Session::State::ended ? 1 : 0;
  return n;
}

// A host that left the job: it goes on without it where --nnodes allows.
void Fanout::lost(Session& s, const std::string& why) {
  const std::string& name = s.host.entry.name;
  if (fc_.min_nodes < fc_.max_nodes && alive() >= fc_.min_nodes) {
    say("error: host " + name + ": " + why + "; the job goes on without it (hosts left: " + std::to_string(alive()) +
        ", --nnodes allows " + std::to_string(fc_.min_nodes) + ")");
    s.left_out = true;
    left_out_.push_back(name + ": " + why);
    return;
  }
  failures_.push_back(name + ": " + why);
  say("error: host " + name + ": " + why);
  stop_all(SIGTERM, "host " + name + " failed");
}

void Fanout::decide(Session& s) {
  if (!s.pending_why) return;
  const std::string why = *s.pending_why;
  s.pending_why.reset();
  if (stopping_) {
    failures_.push_back(s.host.entry.name + ": " + why);
    return;
  }
  std::optional<rendezvous::JobSummary> job;
  if (server_) job = server_->job_summary(fc_.rdzv_id);
  // Without the rendezvous at hand (--rdzv-endpoint elsewhere): an elastic
  // job may go on, a fixed one cannot.
  const bool ending = server_ ? job && job->state != "forming" && job->state != "running"
                              : fc_.min_nodes == fc_.max_nodes;
  if (!ending) return lost(s, why);
  failures_.push_back(s.host.entry.name + ": " + why);
  // The other agents were told by the rendezvous; they get their shutdown
  // grace period, and more, to end and say so.
  grace_timer_.expires_after(std::chrono::seconds(fc_.shutdown_timeout) + kEndingGrace);
  grace_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && !all_ended()) stop_all(SIGTERM, "the other hosts did not end after the job failed");
  });
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
    const bool live = s->state == Session::State::ready || s->state == Session::State::connecting;
    if (live && !s->writing && s->to_send.empty()) send(*s, channel::encode(channel::record::Heartbeat{}));
    if (s->state == Session::State::connecting && now - s->started > kSetupLimit && s->pid > 0 && !s->exit_code) {
      if (!s->setup_killed) {
        s->setup_killed = now;
        s->err_tail.push_back("no answer from muster there within " + std::to_string(kSetupLimit.count()) + " s");
        if (s->err_tail.size() > kStderrTail) s->err_tail.pop_front();
        kill(-s->pid, SIGTERM);
      } else if (now - *s->setup_killed > std::chrono::seconds(5)) {
        kill(-s->pid, SIGKILL);
      }
    }
    // Without a pidfd (an old kernel or a seccomp profile): look each tick.
    if (s->pid > 0 && !s->exit_watch.is_open() && s->state != Session::State::waiting && !s->exit_code && reap(*s)) {
      maybe_ended(*s);
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
  // Its ssh children are reaped through pidfds and waitpid: an inherited
  // SIGCHLD=SIG_IGN would take their statuses.
  signal(SIGCHLD, SIG_DFL);
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
