#include <catch2/catch.hpp>

#include "muster/rendezvous/protocol.hpp"
#include "muster/common/text.hpp"

using namespace muster::rendezvous;

TEST_CASE("frames are a big-endian length and JSON, read back whole", "[frames]") {
  std::string a = encode_frame({{"type", "heartbeat"}, {"v", 1}});
  CHECK(static_cast<unsigned char>(a[0]) == 0);
  CHECK(static_cast<unsigned char>(a[3]) == a.size() - 4);
  std::string b = encode_frame({{"type", "leave"}, {"v", 1}});
  FrameReader r;
  std::string both = a + b;
  for (std::size_t i = 0; i < both.size(); ++i) {
    r.feed(std::string_view(both).substr(i, 1));
    if (i + 1 < a.size()) CHECK_FALSE(r.next().value().has_value());
  }
  auto first = r.next();
  REQUIRE(first.ok());
  REQUIRE(first.value());
  CHECK(parse_message(*first.value()).value()["type"] == "heartbeat");
  CHECK(parse_message(r.next().value().value()).value()["type"] == "leave");
  CHECK_FALSE(r.next().value().has_value());
}

TEST_CASE("an oversized frame breaks the stream before any allocation", "[frames]") {
  FrameReader r;
  r.feed(std::string("\x00\x20\x00\x00", 4));  // 2 MiB
  CHECK_FALSE(r.next().ok());
}

TEST_CASE("messages need a type and this protocol version", "[frames]") {
  CHECK_FALSE(parse_message("[1,2]").ok());
  CHECK_FALSE(parse_message(R"({"v":1})").ok());
  CHECK(parse_message(R"({"type":"x","v":2})").status().message().find("version 2 is not supported") != std::string::npos);
  CHECK(parse_message(R"({"type":"x","v":1})").ok());
}

TEST_CASE("a join survives the round trip and bad settings are refused", "[frames]") {
  JoinMessage m;
  m.job = "job42";
  m.request.node_name = "n1";
  m.request.address = "10.0.0.1";
  m.request.local_world_size = 8;
  m.request.node_rank = 3;
  m.settings.min_nodes = 2;
  m.settings.max_nodes = 4;
  m.settings.keep_alive_interval = std::chrono::milliseconds(1500);
  auto back = join_from_json(to_json(m));
  REQUIRE(back.ok());
  CHECK(back->job == "job42");
  CHECK(back->request.local_world_size == 8);
  CHECK(back->request.node_rank == 3);
  CHECK(back->settings.max_nodes == 4);
  CHECK(back->settings.keep_alive_interval.count() == 1500);
  auto j = to_json(m);
  j["settings"]["min_nodes"] = 5;
  CHECK(join_from_json(j).status().message().find("min_nodes must be > 0 and <= max_nodes") == 0);
  j = to_json(m);
  j["local_world_size"] = "eight";
  CHECK_FALSE(join_from_json(j).ok());
  j.erase("job");
  CHECK_FALSE(join_from_json(j).ok());
}

TEST_CASE("decoders refuse values that do not fit, wrong types and deep nesting", "[frames][hardening]") {
  JoinMessage m;
  m.job = "j";
  m.request.node_name = "n";
  m.request.address = "a";
  auto base = to_json(m);
  auto refused = [&](const char* key, nlohmann::json value, const char* fragment) {
    auto j = base;
    j[key] = value;
    auto r = join_from_json(j);
    INFO(key << " = " << value.dump());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find(fragment) != std::string::npos);
  };
  refused("local_world_size", 1ULL << 40, "local_world_size");
  refused("local_world_size", 1e300, "must be an integer");
  refused("local_world_size", 1.5, "must be an integer");
  refused("local_world_size", 0, "must be in [1, ");
  refused("store_port", 1ULL << 40, "store_port");
  refused("node", "", "\"node\"");
  refused("job", std::string(kMaxNameLength + 1, 'j'), "over the limit");
  refused("is_host", "yes", "true or false");
  auto j = base;
  j["settings"]["join_timeout_ms"] = 1LL << 62;
  CHECK_FALSE(join_from_json(j).ok());
  CHECK_FALSE(parse_message(R"({"type":"join","v":4294967297})").ok());
  CHECK_FALSE(parse_message(R"({"type":"join","v":1.0})").ok());
  std::string deep = R"({"type":"x","v":1,"a":)" + std::string(100, '[') + std::string(100, ']') + "}";
  CHECK(parse_message(deep).status().message().find("nests deeper") != std::string::npos);
  // Brackets inside strings do not count.
  CHECK(parse_message(R"({"type":"x","v":1,"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})").ok());
}

TEST_CASE("every message round-trips through its encoder and decoder", "[frames][hardening]") {
  FailureInfo f{7, 3, -9, "host", "boom", 1700000000};
  auto wf = workers_failed_from_json(to_json(WorkersFailedMessage{4, f}));
  REQUIRE(wf.ok());
  CHECK(wf->round == 4);
  CHECK(wf->failure.exitcode == -9);
  CHECK(wf->failure.message == "boom");
  CHECK(workers_succeeded_from_json(to_json(WorkersSucceededMessage{2})).value().round == 2);
  CHECK_FALSE(workers_failed_from_json({{"type", "workers_failed"}, {"v", 1}, {"round", "x"}}).ok());

  out::Assign a;
  a.round = 1;
  a.group_rank = 1;
  a.group_world_size = 2;
  a.ranks.base_global_rank = 4;
  a.ranks.global_world_size = 8;
  a.ranks.role_world_size = 8;
  a.master_addr = "m";
  a.master_port = 29500;
  auto back = server_message_from_json(to_json(Output(a)));
  REQUIRE(back.ok());
  CHECK(std::get<out::Assign>(back.value()).master_port == 29500);
  auto bad = to_json(Output(a));
  bad.erase("master_port");
  CHECK(server_message_from_json(bad).status().message().find("\"master_port\" is missing") != std::string::npos);
  bad = to_json(Output(a));
  bad["group_rank"] = 2;  // outside a group of 2
  CHECK_FALSE(server_message_from_json(bad).ok());
  auto fin = server_message_from_json(to_json(Output(out::Finished{0, false, f, "failed"})));
  REQUIRE(fin.ok());
  CHECK(std::get<out::Finished>(fin.value()).root_cause->global_rank == 7);
  auto rej = server_message_from_json(to_json(Output(out::Reject{0, muster::Code::closed, "closed"})));
  CHECK(std::get<out::Reject>(rej.value()).code == muster::Code::closed);
}

TEST_CASE("text that is not UTF-8 is encoded, not thrown", "[frames][hardening]") {
  FailureInfo f;
  f.message = "bad \xff\xfe bytes";
  CHECK_NOTHROW(encode_frame(to_json(f)));
  CHECK(muster::log_excerpt(std::string("a\nb") + std::string(300, 'x'), 10).find("\\x0a") != std::string::npos);
}

TEST_CASE("membership messages round-trip and their fields are checked", "[frames][membership]") {
  JoinMessage m;
  m.job = "j";
  m.request.node_name = "n1_00112233445566778899aabbccddeeff";
  m.request.address = "n1";
  m.request.known_round = 4;
  m.request.known_restart_count = 2;
  Resume r;
  r.round = 4;
  r.restart_count = 2;
  r.group_rank = 1;
  r.group_world_size = 2;
  r.ranks = {2, 4, 2, 4};
  r.master_addr = "n0";
  r.master_port = 29500;
  r.outcome = Resume::Outcome::failed;
  r.failure = FailureInfo{3, 1, 42, "n1", "boom", 7, 4242};
  m.request.resume = r;
  m.settings.min_nodes = 1;
  m.settings.max_nodes = 2;
  auto back = join_from_json(to_json(m));
  REQUIRE(back.ok());
  CHECK(back->request.known_round == 4);
  CHECK(back->request.known_restart_count == 2);
  REQUIRE(back->request.resume);
  CHECK(back->request.resume->group_rank == 1);
  CHECK(back->request.resume->ranks.global_world_size == 4);
  CHECK(back->request.resume->outcome == Resume::Outcome::failed);
  REQUIRE(back->request.resume->failure);
  CHECK(back->request.resume->failure->pid == 4242);

  auto j = to_json(m);
  j["resume"]["outcome"] = "maybe";
  CHECK(join_from_json(j).status().message().find("outcome") != std::string::npos);
  j = to_json(m);
  j["resume"].erase("failure");
  CHECK(join_from_json(j).status().message().find("\"failure\" is missing") != std::string::npos);
  j = to_json(m);
  j["resume"]["group_rank"] = 2;  // outside a world of 2
  CHECK_FALSE(join_from_json(j).ok());
  j = to_json(m);
  j["known_round"] = -1;
  CHECK(join_from_json(j).status().message().find("known_round") != std::string::npos);

  auto beat = heartbeat_from_json(heartbeat_message(HeartbeatMessage{77, true}));
  REQUIRE(beat.ok());
  CHECK(beat->seq == 77u);
  CHECK(beat->progress);
  CHECK_FALSE(heartbeat_from_json(nlohmann::json{{"type", "heartbeat"}, {"v", 1}, {"seq", "1"}}).ok());
  CHECK(heartbeat_from_json(heartbeat_message()).value().seq == std::nullopt);

  auto ack = server_message_from_json(heartbeat_ack_message(77));
  REQUIRE(ack.ok());
  CHECK(std::get<HeartbeatAck>(ack.value()).seq == 77u);
  auto fenced = server_message_from_json(to_json(Output(out::Fenced{0, "silent", std::nullopt})));
  REQUIRE(fenced.ok());
  CHECK(std::get<out::Fenced>(fenced.value()).reason == "silent");
  auto resumed = server_message_from_json(to_json(Output(out::Resumed{0, 3})));
  REQUIRE(resumed.ok());
  CHECK(std::get<out::Resumed>(resumed.value()).round == 3);
  auto waiting = server_message_from_json(to_json(Output(out::Waiting{0, 2, 1, 3, 2, 4, Duration(5000), std::nullopt})));
  REQUIRE(waiting.ok());
  const auto& w = std::get<out::Waiting>(waiting.value());
  CHECK((w.round == 2 && w.joined == 1 && w.waiting == 3 && w.min_nodes == 2 && w.max_nodes == 4));
  CHECK(w.join_timeout_left == Duration(5000));
  CHECK_FALSE(w.last_call_left);  // absent (an older rendezvous sends none)
  auto closing = server_message_from_json(
      to_json(Output(out::Waiting{0, 2, 2, 0, 2, 4, Duration(5000), Duration(1500)})));
  REQUIRE(closing.ok());
  CHECK(std::get<out::Waiting>(closing.value()).last_call_left == Duration(1500));
  auto bad = to_json(Output(out::Waiting{0, 2, 1, 3, 2, 4, Duration(5000), std::nullopt}));
  bad.erase("joined");
  CHECK_FALSE(server_message_from_json(bad).ok());
  // A failure without a pid (an older agent) still decodes, with pid 0.
  auto f = to_json(FailureInfo{1, 0, 3, "h", "m", 1, 0});
  CHECK_FALSE(f.contains("pid"));
  CHECK(failure_from_json(f).value().pid == 0);
}

TEST_CASE("exclusion fields are new fields of existing messages, absent when unused", "[frames][exclude]") {
  // Settings: sent only when not the defaults, so an older server never sees them.
  JoinMessage m;
  m.job = "j";
  m.request.node_name = "n";
  m.request.address = "a";
  auto plain = to_json(m);
  CHECK_FALSE(plain["settings"].contains("exclude_after"));
  m.settings.exclude_after = 2;
  m.settings.exclude_cooldown = Duration(7000);
  auto decoded = join_from_json(to_json(m));
  REQUIRE(decoded.ok());
  CHECK(decoded->settings.exclude_after == 2);
  CHECK(decoded->settings.exclude_cooldown == Duration(7000));
  auto negative = to_json(m);
  negative["settings"]["exclude_after"] = -1;
  CHECK_FALSE(join_from_json(negative).ok());

  // A failure: when it happened, and whether it asks for its node's exclusion.
  FailureInfo f{1, 0, 75, "h", "m", 12, 34};
  CHECK_FALSE(to_json(f).contains("exclude_node"));
  f.failed_at_ms = 12'345;
  f.exclude_node = true;
  auto back = failure_from_json(to_json(f));
  REQUIRE(back.ok());
  CHECK(back->failed_at_ms == 12'345);
  CHECK(back->exclude_node);
  auto wrong = to_json(f);
  wrong["exclude_node"] = "yes";
  CHECK_FALSE(failure_from_json(wrong).ok());

  // The fence: an older agent reads the reason and joins again (parked).
  auto fence = to_json(Output(out::Fenced{0, "excluded", Duration(60000)}));
  auto read = server_message_from_json(fence);
  REQUIRE(read.ok());
  CHECK(std::get<out::Fenced>(read.value()).excluded_for == Duration(60000));
  CHECK_FALSE(to_json(Output(out::Fenced{0, "silent", std::nullopt})).contains("excluded_for_ms"));
  fence["excluded_for_ms"] = -5;
  CHECK_FALSE(server_message_from_json(fence).ok());

  // musterctl's view of a job.
  JobReply r;
  r.job.id = "j";
  r.exclusions.push_back({"10.0.0.2", "n2", "why", 2, 5000});
  MemberSummary ms;
  ms.node = "n3";
  ms.address = "10.0.0.2";
  ms.local_world_size = 1;
  ms.parked_ms = 4000;
  r.members.push_back(ms);
  auto reply = job_reply_from_json(to_json(r));
  REQUIRE(reply.ok());
  REQUIRE(reply->exclusions.size() == 1);
  CHECK(reply->exclusions[0].count == 2);
  CHECK(reply->exclusions[0].left_ms == 5000);
  CHECK(reply->members[0].parked_ms == 4000);
}

TEST_CASE("what a peer can do is said in the join and the assignment, and the stacks messages are checked",
          "[frames][stacks]") {
  JoinMessage m;
  m.job = "j";
  m.request.node_name = "n";
  m.request.address = "a";
  CHECK_FALSE(to_json(m).contains("features"));  // an agent that can do nothing new says nothing
  m.request.features = {kFeatureStacks};
  auto back = join_from_json(to_json(m));
  REQUIRE(back.ok());
  CHECK(back->request.features == std::vector<std::string>{kFeatureStacks});
  // A later release's longer list never breaks this one: kept up to the limits, the rest ignored.
  auto many = to_json(m);
  many["features"] = std::vector<std::string>(kMaxFeatures + 5, "x");
  REQUIRE(join_from_json(many).ok());
  CHECK(join_from_json(many)->request.features.size() == kMaxFeatures);
  auto long_name = to_json(m);
  long_name["features"] = {std::string(kMaxFeatureLength + 1, 'x'), kFeatureStacks};
  REQUIRE(join_from_json(long_name).ok());
  CHECK(join_from_json(long_name)->request.features == std::vector<std::string>{kFeatureStacks});
  auto not_strings = to_json(m);
  not_strings["features"] = {1, 2};
  CHECK_FALSE(join_from_json(not_strings).ok());

  out::Assign a{{0, 0, 0, 1, {0, 1, 0, 1}, "h", 1}, 0, {kFeatureStacks}};
  auto assign = server_message_from_json(to_json(Output(a)));
  REQUIRE(assign.ok());
  CHECK(std::get<out::Assign>(assign.value()).features == std::vector<std::string>{kFeatureStacks});

  auto dump = server_message_from_json(to_json(Output(out::DumpStacks{0, "rank 3 hung"})));
  REQUIRE(dump.ok());
  CHECK(std::get<out::DumpStacks>(dump.value()).reason == "rank 3 hung");

  auto hung = hung_from_json(to_json(HungMessage{4, 17}));
  REQUIRE(hung.ok());
  CHECK((hung->round == 4 && hung->global_rank == 17));
  auto bad_hung = to_json(HungMessage{4, 17});
  bad_hung["global_rank"] = -1;
  CHECK_FALSE(hung_from_json(bad_hung).ok());

  auto query = stacks_query_from_json(to_json(StacksQuery{"job"}));
  REQUIRE(query.ok());
  CHECK(query->job == "job");
  auto reply = stacks_reply_from_json(to_json(StacksReply{"running", 3, 1}));
  REQUIRE(reply.ok());
  CHECK((reply->state == "running" && reply->asked == 3 && reply->unable == 1));
}

TEST_CASE("a failing health check's report and its place in a job reply are checked", "[frames][health]") {
  HealthReport h;
  h.job = "j";
  h.node = "10.0.0.2_abc";
  h.address = "10.0.0.2";
  h.failures = 3;
  h.detail = "exit 3: GPU 3: ECC";
  h.retry_in_ms = 20000;
  auto back = health_report_from_json(to_json(h));
  REQUIRE(back.ok());
  CHECK(back->node == h.node);
  CHECK(back->role == "default");
  CHECK(back->failures == 3);
  CHECK(back->detail == h.detail);
  CHECK(back->retry_in_ms == 20000);
  CHECK(back->check_timeout_ms == 0);
  CHECK_FALSE(to_json(h).contains("check_timeout_ms"));  // optional, sent when known
  h.check_timeout_ms = 60000;
  REQUIRE(health_report_from_json(to_json(h)).ok());
  CHECK(health_report_from_json(to_json(h))->check_timeout_ms == 60000);
  auto bad = [&](const char* field, nlohmann::json value) {
    auto j = to_json(h);
    if (value.is_null()) j.erase(field);
    else j[field] = value;
    auto r = health_report_from_json(j);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find(field) != std::string::npos);
  };
  bad("node", "");
  bad("node", nullptr);
  bad("failures", 0);
  bad("failures", 1.5);
  bad("retry_in_ms", -1);
  bad("check_timeout_ms", -1);
  bad("check_timeout_ms", "60s");
  bad("detail", std::string(kMaxHealthDetail + 1, 'x'));
  bad("job", 7);
  CHECK(health_noted_message()["type"] == "health_noted");

  // A job reply without failing nodes says nothing of them; with some, each is checked.
  JobReply r;
  r.job.id = "j";
  CHECK_FALSE(to_json(r).contains("unhealthy"));
  r.unhealthy.push_back({"n2", "10.0.0.2", "default", 2, "exit 1: no GPU", 1500, 5000});
  auto reply = job_reply_from_json(to_json(r));
  REQUIRE(reply.ok());
  REQUIRE(reply->unhealthy.size() == 1);
  CHECK(reply->unhealthy[0].failures == 2);
  CHECK(reply->unhealthy[0].detail == "exit 1: no GPU");
  CHECK(reply->unhealthy[0].reported_ms_ago == 1500);
  CHECK(reply->unhealthy[0].retry_in_ms == 5000);
  auto wrong = to_json(r);
  wrong["unhealthy"][0]["failures"] = 0;
  CHECK_FALSE(job_reply_from_json(wrong).ok());
  wrong = to_json(r);
  wrong["unhealthy"] = nlohmann::json::array();
  for (std::size_t i = 0; i <= kMaxUnhealthyPerJob; ++i) wrong["unhealthy"].push_back(to_json(r)["unhealthy"][0]);
  CHECK_FALSE(job_reply_from_json(wrong).ok());
}
