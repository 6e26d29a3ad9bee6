#include <catch2/catch.hpp>

#include <csignal>

#include "cli.hpp"
#include "muster/rendezvous/protocol.hpp"

using namespace muster::launcher;

namespace {

HostFacts host(int cpus = 8, int gpus = 0) {
  HostFacts h;
  h.cpu_count = cpus;
  h.gpu_count = [gpus] { return muster::Result<int>(gpus); };
  h.new_run_id = []() -> muster::Result<std::string> { return std::string("uuid-1"); };
  return h;
}

muster::Result<LaunchConfig> launch(const std::vector<std::string>& argv, const Environment& env = {},
                                    HostFacts h = host()) {
  auto parsed = parse_args(argv, env);
  if (!parsed.ok()) return parsed.status();
  return resolve_config(parsed.value(), env, h);
}

std::string error_of(const std::vector<std::string>& argv, const Environment& env = {}, HostFacts h = host()) {
  auto r = launch(argv, env, std::move(h));
  REQUIRE_FALSE(r.ok());
  return r.status().message();
}

}  // namespace

TEST_CASE("both spellings of a multi-word option set the same value", "[cli]") {
  for (const auto& spelling : {"--nproc-per-node", "--nproc_per_node"}) {
    auto cfg = launch({spelling, "3", "train.py"});
    REQUIRE(cfg.ok());
    CHECK(cfg->nproc_per_node == 3);
  }
  auto eq = launch({"--nproc_per_node=4", "train.py"});
  REQUIRE(eq.ok());
  CHECK(eq->nproc_per_node == 4);
}

TEST_CASE("a table of torchrun command lines resolves as torchrun resolves them", "[cli]") {
  struct Row {
    std::vector<std::string> argv;
    std::string backend;
    std::string endpoint;
    std::string run_id;
    int nproc;
    int min_nodes;
    int max_nodes;
    int max_restarts;
  };
  std::vector<Row> rows = {
      {{"train.py"}, "c10d", "localhost:0", "uuid-1", 1, 1, 1, 0},
      {{"--standalone", "--rdzv-id=x", "train.py"}, "c10d", "localhost:0", "uuid-1", 1, 1, 1, 0},
      {{"--master-port", "29600", "train.py"}, "static", "127.0.0.1:29600", "none", 1, 1, 1, 0},
      {{"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "train.py"}, "static", "10.0.0.1:29500",
       "none", 1, 2, 2, 0},
      {{"--nnodes=1:4", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400", "--rdzv-id=job", "--max-restarts=3",
        "--nproc-per-node=cpu", "train.py"},
       "c10d", "head:29400", "job", 8, 1, 4, 3},
      {{"--nproc-per-node=auto", "train.py"}, "c10d", "localhost:0", "uuid-1", 8, 1, 1, 0},
      {{"--nnode", "1", "--nproc-", "2", "train.py"}, "c10d", "localhost:0", "uuid-1", 2, 1, 1, 0},
  };
  for (const auto& row : rows) {
    INFO(row.argv.front());
    auto cfg = launch(row.argv);
    REQUIRE(cfg.ok());
    CHECK(cfg->rdzv_backend == row.backend);
    CHECK(cfg->rdzv_endpoint == row.endpoint);
    CHECK(cfg->rdzv_id == row.run_id);
    CHECK(cfg->nproc_per_node == row.nproc);
    CHECK(cfg->min_nodes == row.min_nodes);
    CHECK(cfg->max_nodes == row.max_nodes);
    CHECK(cfg->max_restarts == row.max_restarts);
    CHECK(cfg->rdzv_conf.at("timeout") == "900");
  }
}

TEST_CASE("the script and everything after it pass through untouched", "[cli]") {
  auto cfg = launch({"--nproc-per-node", "2", "train.py", "--nproc-per-node", "5", "--", "-x", "$local_rank"});
  REQUIRE(cfg.ok());
  CHECK(cfg->nproc_per_node == 2);
  CHECK(cfg->executable == "python3");
  CHECK(cfg->args == std::vector<std::string>{"-u", "train.py", "--nproc-per-node", "5", "--", "-x", "$local_rank"});
  CHECK(cfg->entrypoint_name == "train.py");
}

TEST_CASE("a -- before the script ends the options", "[cli]") {
  auto cfg = launch({"--no-python", "--", "--weird-name", "a"});
  REQUIRE(cfg.ok());
  CHECK(cfg->executable == "--weird-name");
  CHECK(cfg->args == std::vector<std::string>{"a"});
}

TEST_CASE("the worker command follows --module, --no-python and PYTHON_EXEC", "[cli]") {
  auto mod = launch({"-m", "pkg.train", "a"});
  REQUIRE(mod.ok());
  CHECK(mod->args == std::vector<std::string>{"-u", "-m", "pkg.train", "a"});
  auto nopy = launch({"--no_python", "/bin/echo", "hi"});
  REQUIRE(nopy.ok());
  CHECK(nopy->executable == "/bin/echo");
  CHECK(nopy->args == std::vector<std::string>{"hi"});
  CHECK(nopy->entrypoint_name == "/bin/echo");
  auto exec = launch({"train.py"}, {{"PYTHON_EXEC", "/opt/py/bin/python"}});
  REQUIRE(exec.ok());
  CHECK(exec->executable == "/opt/py/bin/python");
  CHECK(exec->entrypoint_name == "/opt/py/bin/python");
  // Installed into a Python environment (the wheel): that environment's interpreter,
  // unless PYTHON_EXEC says otherwise.
  HostFacts in_venv = host();
  in_venv.environment_python = "/home/u/venv/bin/python3";
  auto venv = launch({"train.py"}, {}, in_venv);
  REQUIRE(venv.ok());
  CHECK(venv->executable == "/home/u/venv/bin/python3");
  CHECK(venv->entrypoint_name == "train.py");
  auto both = launch({"train.py"}, {{"PYTHON_EXEC", "/opt/py/bin/python"}}, in_venv);
  REQUIRE(both.ok());
  CHECK(both->executable == "/opt/py/bin/python");
  CHECK(launch({"train.py"})->executable == "python3");
  CHECK(error_of({"-m", "--no-python", "x"}) ==
        "Don't use both the '--no-python' flag and the '--module' flag at the same time.");
}

TEST_CASE("short options take attached and separate values and bundle with flags", "[cli]") {
  auto a = launch({"-r3", "-t", "1", "train.py"});
  REQUIRE(a.ok());
  CHECK(a->redirects.for_rank(5) == 3);
  CHECK(a->tee.for_rank(0) == 1);
  auto b = launch({"-mt2", "pkg"});
  REQUIRE(b.ok());
  CHECK(b->module);
  CHECK(b->tee.for_rank(0) == 2);
  auto c = launch({"-r=0:1,1:2", "x"});
  REQUIRE(c.ok());
  CHECK(c->redirects.for_rank(0) == 1);
  CHECK(c->redirects.for_rank(1) == 2);
  CHECK(c->redirects.for_rank(2) == 0);
}

TEST_CASE("PET_ variables give defaults that the command line overrides", "[cli]") {
  Environment env = {{"PET_NPROC_PER_NODE", "4"}, {"PET_MAX_RESTARTS", "2"}, {"PET_STANDALONE", "1"},
                     {"PET_RDZV_ID", "ignored-by-standalone"}, {"PET_TEE", "3"}, {"PET_ROLE", "trainer"}};
  auto cfg = launch({"train.py"}, env);
  REQUIRE(cfg.ok());
  CHECK(cfg->nproc_per_node == 4);
  CHECK(cfg->max_restarts == 2);
  CHECK(cfg->standalone);
  CHECK(cfg->rdzv_id == "uuid-1");
  CHECK(cfg->tee.for_rank(0) == 3);
  CHECK(cfg->role == "trainer");
  auto over = launch({"--nproc-per-node=1", "--max-restarts", "0", "train.py"}, env);
  REQUIRE(over.ok());
  CHECK(over->nproc_per_node == 1);
  CHECK(over->max_restarts == 0);
}

TEST_CASE("bad PET_ values are reported like bad arguments", "[cli]") {
  CHECK(error_of({"x"}, {{"PET_MAX_RESTARTS", "many"}}) ==
        "argument --max-restarts/--max_restarts: invalid int value: 'many'");
  CHECK(error_of({"x"}, {{"PET_STANDALONE", "true"}}).find("PET_STANDALONE='true' must be an integer") != std::string::npos);
}

TEST_CASE("argparse's errors for malformed command lines", "[cli]") {
  CHECK(error_of({}) == "the following arguments are required: training_script, training_script_args");
  CHECK(error_of({"--standalone"}) == "the following arguments are required: training_script, training_script_args");
  CHECK(error_of({"--bogus", "x.py"}) == "unrecognized arguments: --bogus");
  CHECK(error_of({"--nproc", "2", "x.py"}) ==
        "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node");
  CHECK(error_of({"--nnodes"}) == "argument --nnodes: expected one argument");
  CHECK(error_of({"--nnodes", "--standalone", "x"}) == "argument --nnodes: expected one argument");
  CHECK(error_of({"--max-restarts=x", "y"}) == "argument --max-restarts/--max_restarts: invalid int value: 'x'");
  CHECK(error_of({"--standalone=1", "y"}) == "argument --standalone: ignored explicit argument '1'");
  CHECK(error_of({"--start-method", "thread", "y"}) ==
        "argument --start-method/--start_method: invalid choice: 'thread' (choose from 'spawn', 'fork', "
        "'forkserver')");
  CHECK(error_of({"--monitor-interval", "abc", "y"}) ==
        "argument --monitor-interval/--monitor_interval: invalid float value: 'abc'");
}

TEST_CASE("a negative number is a value, not an option", "[cli]") {
  CHECK(error_of({"--max-restarts", "-1", "x"}) == "max_restarts must be >= 0");
}

TEST_CASE("value errors carry torchrun's messages", "[cli]") {
  CHECK(error_of({"--nnodes=1:2:3", "x"}) == "nnodes=1:2:3 is not in \"MIN:MAX\" format");
  CHECK(error_of({"--nnodes=3:2", "x"}) == "min_nodes must be > 0 and <= max_nodes, got min_nodes=3, max_nodes=2");
  CHECK(error_of({"--nnodes=0", "x"}) == "min_nodes must be > 0 and <= max_nodes, got min_nodes=0, max_nodes=0");
  CHECK(error_of({"--nproc-per-node=many", "x"}).find("Unsupported nproc_per_node value: many") == 0);
  CHECK(error_of({"--nproc-per-node=gpu", "x"}).find("--nproc-per-node=gpu: no NVIDIA GPU") == 0);
  CHECK(error_of({"--monitor-interval=0", "x"}) == "monitor_interval must be > 0");
  CHECK(error_of({"--local-ranks-filter=0,a", "x"}) ==
        "--local_ranks_filter must be a comma-separated list of integers e.g. --local_ranks_filter=0,1,2");
  CHECK(error_of({"-r", "4", "x"}).find("4 does not match") == 0);
  CHECK(error_of({"--rdzv-backend=zk", "x"}).find("The rendezvous backend 'zk' is not registered") == 0);
  CHECK(error_of({"--rdzv-backend=etcd", "x"}).find("the rendezvous backend 'etcd' needs an etcd server") == 0);
  CHECK(error_of({"--shutdown-timeout=-1", "x"}) == "shutdown_timeout must be non-negative, got -1");
}

TEST_CASE("gpu counts devices and refuses a machine without one", "[cli]") {
  auto cfg = launch({"--nproc-per-node=gpu", "x"}, {}, host(8, 2));
  REQUIRE(cfg.ok());
  CHECK(cfg->nproc_per_node == 2);
  auto autoc = launch({"--nproc-per-node=auto", "x"}, {}, host(8, 4));
  REQUIRE(autoc.ok());
  CHECK(autoc->nproc_per_node == 4);
}

TEST_CASE("with --run-path the worker runs the script through runpy in the worker's Python", "[cli]") {
  for (auto argv : std::vector<std::vector<std::string>>{{"--run-path", "t.py", "a", "$local_rank"},
                                                         {"--run-path", "--no-python", "-m", "t.py", "a", "$local_rank"}}) {
    auto cfg = launch(argv);
    REQUIRE(cfg.ok());
    CHECK(cfg->executable == "python3");
    REQUIRE(cfg->args.size() == 6);
    CHECK(cfg->args[0] == "-u");
    CHECK(cfg->args[1] == "-c");
    CHECK(cfg->args[2].find("runpy.run_path(sys.argv[0], run_name='__main__')") != std::string::npos);
    CHECK(std::vector<std::string>(cfg->args.begin() + 3, cfg->args.end()) ==
          std::vector<std::string>{"t.py", "a", "$local_rank"});
    CHECK(cfg->entrypoint_name == "run_script_path");
    CHECK_FALSE(cfg->no_python);
    CHECK_FALSE(cfg->module);
  }
}

TEST_CASE("Python-only options are refused with the alternative named", "[cli]") {
  CHECK(error_of({"--logs-specs", "mine", "x.py"}).find("Could not find entrypoint under 'torchrun.logs_specs[mine]' key") == 0);
  CHECK(error_of({"--logs-specs", "mine", "x.py"}).find("use --log-dir") != std::string::npos);
  // torchrun's own default LogsSpecs, by its registered name: the layout muster writes.
  CHECK(launch({"--logs-specs", "default", "x.py"}).ok());
  CHECK(error_of({"--event-log-handler", "bogus", "x.py"}).find("not a registered event handler") != std::string::npos);
  for (const char* handler : {"null", "console", "dynamic_rendezvous"}) {
    CHECK(launch({"--event-log-handler", handler, "x.py"})->event_log_handler == handler);
  }
}

TEST_CASE("OMP_NUM_THREADS is set only when absent and nproc > 1", "[cli]") {
  CHECK(launch({"--nproc-per-node=2", "x"})->set_omp_num_threads);
  CHECK_FALSE(launch({"--nproc-per-node=1", "x"})->set_omp_num_threads);
  CHECK_FALSE(launch({"--nproc-per-node=2", "x"}, {{"OMP_NUM_THREADS", ""}})->set_omp_num_threads);
}

TEST_CASE("the static backend takes its rank from --node-rank and its endpoint from master addr and port", "[cli]") {
  auto cfg = launch({"--rdzv-backend=static", "--master-addr=[::1]", "--master-port=1234", "--node-rank=0",
                     "--rdzv-conf=rank=7,join_timeout=5", "x"});
  REQUIRE(cfg.ok());
  CHECK(cfg->rdzv_conf.at("rank") == "0");
  CHECK(cfg->rdzv_conf.at("join_timeout") == "5");
  CHECK(cfg->rdzv_endpoint == "[::1]:1234");
}

TEST_CASE("shutdown timeout and signals come from flags or the environment", "[cli]") {
  auto env_t = launch({"x"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}});
  REQUIRE(env_t.ok());
  CHECK(env_t->shutdown_timeout == 7);
  auto flag_t = launch({"--shutdown-timeout=3", "x"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}});
  CHECK(flag_t->shutdown_timeout == 3);
  CHECK(launch({"x"})->shutdown_timeout == 30);
  auto sigs = launch({"--signals-to-handle=SIGUSR1,SIGBOGUS,SIGTERM", "x"});
  REQUIRE(sigs.ok());
  CHECK(sigs->signal_numbers == std::vector<int>{SIGUSR1, SIGTERM});
  REQUIRE(sigs->warnings.size() == 1);
  CHECK(sigs->warnings[0].find("SIGBOGUS") != std::string::npos);
}

TEST_CASE("duplicate filters split on commas with ',,' as a literal comma", "[cli]") {
  auto cfg = launch({"--duplicate-stdout-filters=loss,,acc,epoch", "x"});
  REQUIRE(cfg.ok());
  CHECK(cfg->duplicate_stdout_filters == std::vector<std::string>{"loss,acc", "epoch"});
}

TEST_CASE("help is recognised anywhere before the script", "[cli]") {
  auto parsed = parse_args({"--nnodes", "1", "-h"}, {});
  REQUIRE(parsed.ok());
  CHECK(parsed->help);
  CHECK(help_text("muster").find("--nproc-per-node NPROC_PER_NODE, --nproc_per_node NPROC_PER_NODE") !=
        std::string::npos);
}

TEST_CASE("the static backend's node rank and endpoint are checked once, when the command line resolves", "[cli]") {
  CHECK(error_of({"--master-port=29555", "--node-rank=1", "x.py"}) ==
        "--node-rank=1 does not exist in a job of one node; use --node-rank=0 or --nnodes=N");
  CHECK(error_of({"--nnodes=2", "--node-rank=2", "x.py"}) == "--node-rank=2 is outside [0, 2) for --nnodes=2");
  CHECK(error_of({"--rdzv-backend=static", "--rdzv-endpoint=head", "--nnodes=2", "x.py"}) ==
        "port is missing in endpoint: head. Try to specify --master-port");
  auto ok = launch({"--nnodes=2", "--node-rank=1", "--master-addr=head", "x.py"});
  REQUIRE(ok.ok());
  CHECK(ok->rdzv_endpoint == "head:29500");
  // Other backends ignore --node-rank, as torchrun does.
  CHECK(launch({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400", "--node-rank=7", "x.py"}).ok());
}

TEST_CASE("the keys of --rdzv-conf are resolved and checked once, when the command line resolves", "[cli]") {
  auto cfg = launch({"--nnodes=1:2", "--rdzv-endpoint=h:1", "--rdzv-backend=c10d", "--rdzv-conf",
                     "join_timeout=7,last_call_timeout=0.25,keep_alive_interval=2,keep_alive_max_attempt=4,"
                     "reconnect_timeout=9,is_host=no",
                     "x.py"});
  REQUIRE(cfg.ok());
  CHECK(cfg->rdzv.join_timeout == std::chrono::seconds(7));
  CHECK(cfg->rdzv.last_call_timeout == std::chrono::milliseconds(250));
  CHECK(cfg->rdzv.close_timeout == std::chrono::seconds(30));
  CHECK(cfg->rdzv.keep_alive_interval == std::chrono::seconds(2));
  CHECK(cfg->rdzv.keep_alive_max_attempt == 4);
  CHECK(cfg->rdzv.reconnect_timeout == std::chrono::seconds(9));
  CHECK(cfg->rdzv.is_host == false);
  CHECK(cfg->rdzv.exclude_after == 0);  // off by default
  auto ex = launch({"--nnodes=1:2", "--rdzv-conf=exclude_after=2,exclude_cooldown=1.5", "--exclude-exit-code=75", "x.py"});
  REQUIRE(ex.ok());
  CHECK(ex->rdzv.exclude_after == 2);
  CHECK(ex->rdzv.exclude_cooldown == std::chrono::milliseconds(1500));
  CHECK(ex->exclude_exit_code == 75);
  CHECK_THAT(error_of({"--rdzv-conf=exclude_after=-1", "x.py"}), Catch::StartsWith("--rdzv-conf exclude_after=-1: give"));
  CHECK_THAT(error_of({"--exclude-exit-code=0", "x.py"}), Catch::StartsWith("--exclude-exit-code='0': give the exit code"));
  CHECK_THAT(error_of({"--exclude-exit-code=256", "x.py"}), Catch::StartsWith("--exclude-exit-code='256'"));
  CHECK_FALSE(launch({"--nnodes=2", "--rdzv-endpoint=h:1", "--rdzv-backend=c10d", "x.py"})->rdzv.is_host);
  // The static backend waits `timeout` for every node.
  CHECK(launch({"--nnodes=2", "--rdzv-conf=timeout=12", "x.py"})->rdzv.join_timeout == std::chrono::seconds(12));
  CHECK(error_of({"--rdzv-conf=keep_alive_interval=x", "x.py"}) ==
        "The rendezvous configuration option 'keep_alive_interval' must be a number of seconds, got 'x'");
  CHECK_THAT(error_of({"--rdzv-conf=keep_alive_interval=0", "x.py"}), Catch::StartsWith("keep_alive_interval must be > 0"));
  CHECK(error_of({"--rdzv-conf=is_host=maybe", "x.py"}) ==
        "The rendezvous configuration option 'is_host' does not represent a valid boolean value.");
  auto year = launch({"--rdzv-conf=join_timeout=1e12", "x.py"});
  REQUIRE(year.ok());
  CHECK(year->rdzv.join_timeout.count() == muster::rendezvous::kMaxTimeoutMs);
  CHECK(year->warnings.back() == "--rdzv-conf join_timeout=1e12 is longer than a year; using a year");
}
