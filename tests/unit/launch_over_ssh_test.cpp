// muster --hostfile's pure parts: the host list, --include/--exclude, the
// channel to a remote agent, the resolved launch and the remote command.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli.hpp"
#include "fanout_config.hpp"
#include "host_list.hpp"
#include "launch_channel.hpp"

using namespace muster::launcher;

namespace {

template <typename T>
std::string error_of(const muster::Result<T>& r) {
  REQUIRE_FALSE(r.ok());
  return r.status().message();
}

FanoutFacts facts(std::map<std::string, std::string> files = {}) {
  FanoutFacts f;
  f.host.cpu_count = 8;
  f.host.gpu_count = [] { return muster::Result<int>(0); };
  f.host.new_run_id = []() -> muster::Result<std::string> { return std::string("fresh-id"); };
  f.working_dir = "/work/dir";
  f.muster_path = "/opt/muster/bin/muster";
  f.home = "/home/u";
  f.read_file = [files](const std::string& path) -> std::optional<std::string> {
    auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
  return f;
}

muster::Result<FanoutConfig> fanout(const std::vector<std::string>& argv, const Environment& env = {},
                                    const FanoutFacts& f = facts()) {
  auto parsed = parse_args(argv, env);
  if (!parsed.ok()) return parsed.status();
  REQUIRE(wants_fanout(parsed.value()));
  return resolve_fanout(parsed.value(), env, f);
}

bool has(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

TEST_CASE("a host file takes DeepSpeed's and Open MPI's lines", "[hosts]") {
  auto hosts = parse_host_file(
      "# the cluster\n\nnode-a slots=4\n  node-b   slots=2   # spare\nroot@node-c\n[fe80::1%eth0] slots=8 max_slots=8\n",
      "hosts.txt");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 4);
  CHECK((*hosts)[0].name == "node-a");
  CHECK((*hosts)[0].slots == 4);
  CHECK((*hosts)[0].where == "hosts.txt:3");
  CHECK((*hosts)[1].slots == 2);
  CHECK((*hosts)[2].target == "root@node-c");
  CHECK_FALSE((*hosts)[2].slots.has_value());
  CHECK((*hosts)[3].name == "[fe80::1%eth0]");
  CHECK((*hosts)[3].target == "fe80::1%eth0");
}

TEST_CASE("a bad host file is refused with its file, line and reason", "[hosts]") {
  CHECK(error_of(parse_host_file("a slots=0\n", "h")) == "h:1: slots 0 is out of range (1 to 1024)");
  CHECK(error_of(parse_host_file("a\nb slots=2 slots=3\n", "h")) == "h:2: slots is given twice");
  CHECK(error_of(parse_host_file("a\n\nb gpus=2\n", "h")).find("h:3: unknown field 'gpus'") == 0);
  CHECK(error_of(parse_host_file("a\nb x\n", "h")).find("h:2: 'x' is not a field") == 0);
  CHECK(error_of(parse_host_file("-oProxyCommand=evil\n", "h")).find("h:1: '-oProxyCommand=evil' is not a host name") == 0);
  CHECK(error_of(parse_host_file("a;reboot\n", "h")).find("is not a host name") != std::string::npos);
  CHECK(error_of(parse_host_file("::1\n", "h")).find("put an IPv6 address in brackets, as [::1]") != std::string::npos);
  CHECK(error_of(parse_host_file("[::1\n", "h")).find("in brackets") != std::string::npos);
  CHECK(error_of(parse_host_file("[-F:x]\n", "h")).find("is not an IPv6 address") != std::string::npos);
  CHECK(error_of(parse_host_file("a\nb\na slots=2\n", "h")) == "h:3: host a is already listed (h:1)");
  CHECK(error_of(parse_host_file("# only a comment\n", "h")).find("no host in the file") != std::string::npos);
  CHECK(error_of(parse_host_file(std::string(kMaxHostFileLine + 1, 'a'), "h")).find("longer than") != std::string::npos);
}

TEST_CASE("the --hosts option lists hosts with optional slots, IPv6 in brackets", "[hosts]") {
  auto hosts = parse_hosts_option("a:2,b,[::1]:4,u@[fe80::2]:1");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 4);
  CHECK((*hosts)[0].slots == 2);
  CHECK_FALSE((*hosts)[1].slots.has_value());
  CHECK((*hosts)[2].target == "::1");
  CHECK((*hosts)[2].slots == 4);
  CHECK((*hosts)[3].target == "u@fe80::2");
  CHECK(error_of(parse_hosts_option("a,,b")).find("an empty host") != std::string::npos);
  CHECK(error_of(parse_hosts_option("a:x")).find("slots 'x' is not a number") != std::string::npos);
  CHECK(error_of(parse_hosts_option("[::1]x")).find("expected ':' after ']'") != std::string::npos);
}

TEST_CASE("the --include and --exclude options pick hosts and slots as DeepSpeed does", "[hosts]") {
  auto all = parse_hosts_option("a:4,b:4,c:2");
  REQUIRE(all.ok());
  auto only = select_hosts(all.value(), "a@c:1", "", std::nullopt);
  REQUIRE(only.ok());
  REQUIRE(only->size() == 2);
  CHECK((*only)[0].name == "a");
  CHECK_FALSE((*only)[0].chosen_slots.has_value());
  CHECK((*only)[1].chosen_slots == std::vector<int>{1});

  auto without = select_hosts(all.value(), "", "b@a:0,2", std::nullopt);
  REQUIRE(without.ok());
  REQUIRE(without->size() == 2);
  CHECK((*without)[0].chosen_slots == std::vector<int>{1, 3});
  CHECK((*without)[1].name == "c");

  // Every slot of a host taken away takes the host away.
  auto gone = select_hosts(all.value(), "", "c:0,1", std::nullopt);
  REQUIRE(gone.ok());
  CHECK(gone->size() == 2);

  CHECK(error_of(select_hosts(all.value(), "a", "b", std::nullopt)) ==
        "--include and --exclude cannot be given together");
  CHECK(error_of(select_hosts(all.value(), "z", "", std::nullopt)) == "--include: host z is not among the hosts given");
  CHECK(error_of(select_hosts(all.value(), "c:2", "", std::nullopt)) ==
        "--include: host c has 2 slots (0 to 1), not slot 2");
  CHECK(error_of(select_hosts(all.value(), "", "a@b@c", std::nullopt)) == "--exclude: no host is left to run on");
  // Every entry of a host is checked, the one without slots too.
  auto two_users = parse_hosts_option("alice@h:4,bob@h");
  REQUIRE(two_users.ok());
  CHECK(error_of(select_hosts(two_users.value(), "", "h:0", std::nullopt)).find("has no slot count") !=
        std::string::npos);
  auto plain = parse_hosts_option("x,y");
  REQUIRE(plain.ok());
  CHECK(error_of(select_hosts(plain.value(), "x:0", "", std::nullopt)).find("has no slot count") != std::string::npos);
  auto by_default = select_hosts(plain.value(), "x:1", "", 2);
  REQUIRE(by_default.ok());
  CHECK((*by_default)[0].chosen_slots == std::vector<int>{1});
}

TEST_CASE("the launch channel's header and records round-trip and refuse what is not theirs", "[channel]") {
  channel::Header h;
  h.version = "0.1.0 (git abc)";
  h.order = 3;
  h.rdzv_endpoint = ":4242";
  h.key_hex = "00ff";
  h.env = {{"NCCL_DEBUG", "INFO"}, {"WITH_NEWLINE", "a\nb"}};
  auto line = channel::encode_header(h);
  REQUIRE(line.back() == '\n');
  REQUIRE(std::count(line.begin(), line.end(), '\n') == 1);
  auto back = channel::decode_header(std::string_view(line).substr(0, line.size() - 1));
  REQUIRE(back.ok());
  CHECK(back->order == 3);
  CHECK(back->key_hex == std::optional<std::string>("00ff"));
  CHECK(back->env == h.env);

  CHECK_FALSE(channel::decode_header("[]").ok());
  CHECK_FALSE(channel::decode_header("{\"channel\": 2}").ok());
  CHECK(error_of(channel::decode_header(
            R"({"channel":1,"version":"v","order":0,"heartbeat_ms":1000,"rdzv_endpoint":":1","env":{"BAD-NAME":"x"}})"))
            .find("bad name") != std::string::npos);
  CHECK(error_of(channel::decode_header(
            R"({"channel":1,"version":"v","order":-1,"heartbeat_ms":1000,"rdzv_endpoint":":1","env":{}})"))
            .find("order is out of range") != std::string::npos);
  CHECK(error_of(channel::decode_header(
            R"({"channel":1,"version":"v","order":0,"heartbeat_ms":1000,"rdzv_endpoint":":1","env":{},"key":"xyz"})"))
            .find("key is not hex") != std::string::npos);
  CHECK_FALSE(channel::decode_header(std::string(channel::kMaxHeaderBytes + 1, ' ')).ok());

  auto hb = channel::decode_record("h");
  REQUIRE(hb.ok());
  CHECK(std::holds_alternative<channel::record::Heartbeat>(hb.value()));
  auto stop = channel::decode_record("stop SIGINT");
  REQUIRE(stop.ok());
  CHECK(std::get<channel::record::Stop>(stop.value()).signo == SIGINT);
  CHECK(channel::encode(channel::record::Stop{SIGTERM}) == "stop SIGTERM\n");
  CHECK_FALSE(channel::decode_record("stop SIGNOPE").ok());
  CHECK_FALSE(channel::decode_record("reboot").ok());
}

TEST_CASE("the rendezvous at the launching host is found from SSH_CONNECTION", "[channel]") {
  CHECK(channel::resolve_endpoint(":4242", "10.0.0.5 51000 10.0.0.9 22").value() == "10.0.0.5:4242");
  CHECK(channel::resolve_endpoint(":4242", "fd00::5 51000 fd00::9 22").value() == "[fd00::5]:4242");
  CHECK(channel::resolve_endpoint("head:29400", "").value() == "head:29400");
  CHECK(error_of(channel::resolve_endpoint(":4242", "")).find("SSH_CONNECTION") != std::string::npos);
}

TEST_CASE("a launch over ssh resolves hosts, slots, node count and what every agent gets", "[fanout]") {
  Environment env = {{"NCCL_SOCKET_IFNAME", "eth0"}, {"CUDA_VISIBLE_DEVICES", "0"}, {"SECRET", "s"},
                     {"PATH", "/usr/bin"}, {"PYTHON_EXEC", "/env/bin/python"}};
  auto files = std::map<std::string, std::string>{{"/work/dir/.muster_env", "# mine\nexport WANDB_MODE=offline\n"}};
  auto fc = fanout({"--hosts=a:2,b", "--max-restarts=3", "--export=EXTRA=1", "--export", "SECRET", "train.py",
                    "--lr", "0.1"},
                   env, facts(files));
  REQUIRE(fc.ok());
  REQUIRE(fc->hosts.size() == 2);
  CHECK(fc->hosts[0].nproc_per_node == "2");
  CHECK(fc->hosts[1].nproc_per_node == "1");  // no slots, no --nproc-per-node: torchrun's default
  CHECK(fc->hosts[1].order == 1);
  CHECK(fc->min_nodes == 2);
  CHECK(fc->max_nodes == 2);
  CHECK(fc->rdzv_id == "fresh-id");
  CHECK(has(fc->agent_args, "--nnodes=2:2"));
  CHECK(has(fc->agent_args, "--rdzv-backend=c10d"));
  CHECK(has(fc->agent_args, "--rdzv-id=fresh-id"));
  CHECK(has(fc->agent_args, "--max-restarts=3"));
  CHECK(has(fc->agent_args, "--tee=3"));
  CHECK_FALSE(has(fc->agent_args, "--hosts=a:2,b"));
  CHECK(fc->command == std::vector<std::string>{"train.py", "--lr", "0.1"});
  CHECK(fc->exports.at("NCCL_SOCKET_IFNAME") == "eth0");
  CHECK(fc->exports.count("CUDA_VISIBLE_DEVICES") == 0);
  CHECK(fc->exports.at("WANDB_MODE") == "offline");
  CHECK(fc->exports.at("EXTRA") == "1");
  CHECK(fc->exports.at("SECRET") == "s");
  CHECK(fc->exports.at("PYTHON_EXEC") == "/env/bin/python");
  CHECK(fc->exports.count("PATH") == 0);
  CHECK(fc->ssh == std::vector<std::string>{"ssh"});
  CHECK(fc->fanout == kDefaultFanout);

  auto given = fanout({"--hosts=a:2,b:4", "--nproc-per-node=3", "--nnodes=1:2", "--rdzv-id=mine", "-t", "0", "x.py"});
  REQUIRE(given.ok());
  CHECK(given->hosts[0].nproc_per_node == "3");  // the command line's wins over slots
  CHECK(given->min_nodes == 1);
  CHECK(given->rdzv_id == "mine");
  CHECK_FALSE(has(given->agent_args, "--tee=3"));
  CHECK(has(given->agent_args, "--tee=0"));

  auto chosen = fanout({"--hosts=a:4", "--include=a:1,3", "x.py"});
  REQUIRE(chosen.ok());
  CHECK(chosen->hosts[0].nproc_per_node == "2");
  CHECK(chosen->hosts[0].cuda_visible_devices == std::optional<std::string>("1,3"));

  auto wrapped = fanout({"--hosts=a", "x.py"}, {{"MUSTER_SSH", "ssh -p 2222"}, {"MUSTER_SSH_FANOUT", "4"}});
  REQUIRE(wrapped.ok());
  CHECK(wrapped->ssh.front() == "/bin/sh");
  CHECK(wrapped->ssh[2] == "exec ssh -p 2222 \"$@\"");
  CHECK(wrapped->fanout == 4);
}

TEST_CASE("a launch over ssh refuses what cannot work, before any connection", "[fanout]") {
  CHECK(error_of(fanout({"--hosts=a,b,c", "--nnodes=2", "x.py"})).find("does not admit the 3 hosts") !=
        std::string::npos);
  CHECK(error_of(fanout({"--hosts=a", "--rdzv-backend=static", "x.py"})).find("uses the c10d rendezvous") !=
        std::string::npos);
  CHECK(error_of(fanout({"--hosts=a", "--node-rank=1", "x.py"})).find("node ranks follow") != std::string::npos);
  CHECK(error_of(fanout({"--hosts=a", "--standalone", "x.py"})).find("--standalone runs one node") !=
        std::string::npos);
  CHECK(error_of(fanout({"--hosts=a", "--hostfile=f", "x.py"})) == "give --hostfile or --hosts, not both");
  CHECK(error_of(fanout({"--hosts=a", "--export", "NOT_SET_HERE", "x.py"})).find("NOT_SET_HERE is not set here") !=
        std::string::npos);
  CHECK(error_of(fanout({"--hosts=a", "--export", "1BAD=x", "x.py"})).find("is not a variable name") !=
        std::string::npos);
  CHECK(error_of(fanout({"--hosts=a", "--tee=9", "x.py"})).find("9") != std::string::npos);  // the agent's own checks
  CHECK(error_of(fanout({"--hosts=a", "x.py"}, {{"MUSTER_SSH_FANOUT", "0"}})).find("MUSTER_SSH_FANOUT") !=
        std::string::npos);
  CHECK(error_of(fanout({"--hosts=a", "x.py"}, {{"NCCL_BAD", std::string("caf\xe9")}})).find("is not UTF-8") !=
        std::string::npos);
  auto bad_env = facts({{"/home/u/.muster_env", "GOOD=1\nnot a line\n"}});
  CHECK(error_of(fanout({"--hosts=a", "x.py"}, {}, bad_env)) ==
        "/home/u/.muster_env:2: expected NAME=VALUE, got 'not a line'");
  CHECK(error_of(fanout({"--hostfile=/nonexistent/hosts", "x.py"})) == "--hostfile /nonexistent/hosts: no such file");
}

TEST_CASE("muster's new options leave torchrun's unique abbreviations their meaning", "[fanout]") {
  // --h is torchrun's --help, beside --hostfile and --hosts.
  auto h = parse_args({"--h"}, {});
  REQUIRE(h.ok());
  CHECK(h->help);
  auto ho = parse_args({"--host", "a", "x.py"}, {});  // --hosts or --hostfile: ambiguous
  CHECK_FALSE(ho.ok());
  // --he is still --help beside --health-check*. torchrun has no option
  // that starts --ex, so --ex matches muster's own alone and is ambiguous.
  auto he = parse_args({"--he"}, {});
  REQUIRE(he.ok());
  CHECK(he->help);
  auto ex = parse_args({"--ex=7", "x.py"}, {});
  REQUIRE_FALSE(ex.ok());
  CHECK(ex.status().message().find("ambiguous option: --ex could match --exclude-exit-code") != std::string::npos);
  auto code = parse_args({"--exclude-exit-code=75", "x.py"}, {});
  REQUIRE(code.ok());
  CHECK(code->values.at("exclude_exit_code") == "75");
}

namespace {
// Runs the remote command with /bin/sh as ssh's far end would, here.
std::pair<int, std::string> run_remote(const std::string& command) {
  std::string out_path = std::filesystem::temp_directory_path() / ("remote_" + std::to_string(getpid()));
  std::string shell = command + " 2>" + out_path;
  int status = std::system(shell.c_str());
  std::ifstream in(out_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(out_path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}
}  // namespace

TEST_CASE("the remote command enters the directory, finds muster and says which is missing", "[fanout]") {
  FanoutConfig fc;
  fc.working_dir = "/nonexistent/dir it's";
  fc.muster_path = "/bin/echo";
  auto [code, err] = run_remote("(" + remote_command(fc, {"a"}) + ")");
  CHECK(code == kExitNoDirectory);
  CHECK(err.find("the working directory /nonexistent/dir it's does not exist on") != std::string::npos);

  fc.working_dir = "/";
  fc.muster_path = "/nonexistent/muster";
  std::tie(code, err) = run_remote("(PATH=/nonexistent; " + remote_command(fc, {"a"}) + ")");
  CHECK(code == kExitNoMuster);
  CHECK(err.find("muster is not installed on") != std::string::npos);

  // Arguments arrive as they were, quotes and all.
  fc.muster_path = "/bin/sh";
  std::string out_file = std::filesystem::temp_directory_path() / ("args_" + std::to_string(getpid()));
  std::tie(code, err) =
      run_remote("(" + remote_command(fc, {"-c", "printf '%s|' \"$@\" > " + out_file, "sh", "it's", "a b", "$HOME"}) +
                 ")");
  CHECK(code == 0);
  std::ifstream in(out_file);
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(out_file);
  CHECK(got == "it's|a b|$HOME|");

  auto argv = ssh_argv(fc, RemoteHost{HostEntry{"n", "user@n", std::nullopt, std::nullopt, "f:1"}, 0, "1", {}}, "cmd");
  CHECK(argv.front() == "ssh");
  CHECK(has(argv, "BatchMode=yes"));
  CHECK(argv[argv.size() - 3] == "--");
  CHECK(argv[argv.size() - 2] == "user@n");
  CHECK(argv.back() == "cmd");
}
