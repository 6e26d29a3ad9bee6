#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "event_log.hpp"

using namespace muster::launcher;
using ojson = nlohmann::ordered_json;

TEST_CASE("JSON is written as Python's json.dumps writes it", "[event_log]") {
  ojson v;
  v["b"] = 1;
  v["a"] = ojson::array({nullptr, true, "x\xc3\xa9\n"});  // non-ASCII and a newline, escaped
  v["f"] = 287.6152520002506;
  CHECK(python_json(v) == R"({"b": 1, "a": [null, true, "x\u00e9\n"], "f": 287.6152520002506})");
  // Strings as json.dumps(ensure_ascii) writes them; bytes that are not UTF-8 as
  // Python's surrogateescape holds them (argv, environment).
  CHECK(python_json(ojson("\x7f\xc3\xa9\xf0\x9f\x98\x80\\\"")) == R"("\u007f\u00e9\ud83d\ude00\\\"")");
  CHECK(python_json(ojson(std::string("a\xe9" "b\xc3"))) == R"("a\udce9b\udcc3")");
  CHECK(python_json(ojson(std::string("\xed\xa0\x80"))) == R"("\udced\udca0\udc80")");  // no UTF-8 surrogates
  // Floats as Python's repr.
  auto f = [](double d) { return python_json(ojson(d)); };
  CHECK(f(0.2883589995690272) == "0.2883589995690272");
  CHECK(f(3.0) == "3.0");
  CHECK(f(1e16) == "1e+16");
  CHECK(f(1.5e-05) == "1.5e-05");
  CHECK(f(0.0001) == "0.0001");
  CHECK(f(123456789012345.0) == "123456789012345.0");
  CHECK(f(-2.5) == "-2.5");
  CHECK(f(0.0) == "0.0");
}

TEST_CASE("an event has torch's fields in torch's order", "[event_log]") {
  EventJob job{"run-1", "default", "localhost", "c10d", "sh"};
  EventGroup group;
  CHECK(format_event("RENDEZVOUS", "AGENT", job, group, nullptr, std::nullopt, 2.5) ==
        R"({"name": "torchelastic.worker.status.RENDEZVOUS", "source": "AGENT", "timestamp": 0, "metadata": )"
        R"({"run_id": "run-1", "global_rank": null, "group_rank": null, "worker_id": null, "role": "default", )"
        R"("hostname": "localhost", "state": "RENDEZVOUS", "total_run_time": 0, "rdzv_backend": "c10d", )"
        R"("raw_error": null, "metadata": "{\"group_world_size\": null, \"entry_point\": \"sh\"}", )"
        R"("agent_restarts": 0, "duration_ms": 2.5}})");
  group.group_rank = 0;
  group.group_world_size = 1;
  group.agent_restarts = 1;
  group.total_run_time = 7;
  EventWorker w{1, 1, 1, 2, "4242", 3, 4242};
  CHECK(format_event("FAILED", "WORKER", job, group, &w, std::string("{\"message\": \"<NONE>\"}"), std::nullopt) ==
        R"({"name": "torchelastic.worker.status.FAILED", "source": "WORKER", "timestamp": 0, "metadata": )"
        R"({"run_id": "run-1", "global_rank": 1, "group_rank": 0, "worker_id": "4242", "role": "default", )"
        R"("hostname": "localhost", "state": "FAILED", "total_run_time": 7, "rdzv_backend": "c10d", )"
        R"("raw_error": "{\"message\": \"<NONE>\"}", "metadata": "{\"group_world_size\": 1, \"entry_point\": )"
        R"(\"sh\", \"local_rank\": [1], \"role_rank\": [1], \"role_world_size\": [2], \"exit_code\": [3], )"
        R"(\"worker_pid\": [4242]}", "agent_restarts": 1, "duration_ms": null}})");
}

TEST_CASE("a failure's raw error is its error file, or torch's empty data", "[event_log]") {
  bool traits = false;
  // A signal without an error file: no traits (yet).
  CHECK(failure_raw_error("", -15, traits) == R"({"message": "<NONE>"})");
  CHECK(failure_raw_error("/nonexistent/error.json", 1, traits) ==
        R"({"message": "<NONE>", "errorTraits": {"category": "system_terminated_error", "retryability": "False"}})");
  // torch's shared dictionary: from now on the signal's data carries them too.
  CHECK(failure_raw_error("", -15, traits).find("errorTraits") != std::string::npos);
  char path[] = "/tmp/muster-event-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(path) << R"({"message":{"message":"ValueError: boom","extraInfo":{"py_callstack":"tb","timestamp":"17"}}})";
  CHECK(failure_raw_error(path, 1, traits) ==
        R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "tb", "timestamp": "17"}}})");
  std::remove(path);
}
