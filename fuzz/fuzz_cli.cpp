// libFuzzer target: the agent's command line (torchrun's options, PET_*
// defaults), --rdzv-conf, -r/-t stream specs and endpoints. The input is
// split on NUL bytes into arguments; the first one also serves as each of
// the small parsers' input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli.hpp"
#include "muster/common/endpoint.hpp"
#include "rdzv_conf.hpp"
#include "std_spec.hpp"

using namespace muster::launcher;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  std::vector<std::string> argv;
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      argv.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  argv.push_back(std::move(current));
  if (argv.size() > 64) argv.resize(64);
  const std::string& first = argv.front();

  (void)muster::parse_endpoint(first, 29400);
  (void)StdSpec::parse(first);
  if (auto conf = parse_rdzv_conf(first); conf.ok()) {
    for (const auto& [key, value] : conf.value()) {
      (void)rdzv_conf_int(conf.value(), key, 0);
      (void)rdzv_conf_bool(conf.value(), key, false);
    }
  }
  Environment env;
  if (argv.size() > 1 && argv[1].rfind("PET_", 0) == 0) {
    auto eq = argv[1].find('=');
    if (eq != std::string::npos) env[argv[1].substr(0, eq)] = argv[1].substr(eq + 1);
  }
  auto parsed = parse_args(argv, env);
  if (parsed.ok()) {
    HostFacts host;
    host.cpu_count = 2;
    host.gpu_count = [] { return muster::Result<int>(0); };
    host.new_run_id = [] { return std::string("fuzz"); };
    (void)resolve_config(parsed.value(), env, host);
  }
  return 0;
}
