#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "muster/rendezvous/auth.hpp"
#include "muster/rendezvous/client.hpp"
#include "muster/rendezvous/handshake.hpp"
#include "muster/rendezvous/protocol.hpp"
#include "muster/rendezvous/server.hpp"

using namespace muster;
using namespace muster::rendezvous;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/muster-auth-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& bytes, mode_t mode = 0600) {
    fs::path p = path / name;
    std::ofstream(p, std::ios::binary) << bytes;
    REQUIRE(::chmod(p.c_str(), mode) == 0);
    return p;
  }
};

const std::string kKey = "0123456789abcdef0123456789abcdef";

}  // namespace

TEST_CASE("auth: HMAC-SHA256 gives RFC 4231's value for its test case 2") {
  auto mac = auth::hmac("Jefe", {"what do ya ", "want for nothing?"});
  CHECK(auth::to_hex(mac) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("auth: hex decoding takes exactly the length asked for") {
  CHECK(auth::from_hex("00ff7A", 3) == std::string("\x00\xff\x7a", 3));
  CHECK_FALSE(auth::from_hex("00ff7", 3));
  CHECK_FALSE(auth::from_hex("00ff7a00", 3));
  CHECK_FALSE(auth::from_hex("00fg7a", 3));
  CHECK(auth::to_hex(std::string("\x01\xab", 2)) == "01ab");
}

TEST_CASE("auth: same() compares length and bytes") {
  CHECK(auth::same("abc", "abc"));
  CHECK_FALSE(auth::same("abc", "abd"));
  CHECK_FALSE(auth::same("abc", "abcd"));
}

TEST_CASE("auth: key files") {
  TempDir dir;
  SECTION("a private file of enough bytes is the key, less one trailing newline") {
    auto key = auth::load_key_file(dir.write("k", kKey + "\n"));
    REQUIRE(key.ok());
    CHECK(key->bytes() == kKey);
    auto crlf = auth::load_key_file(dir.write("k2", kKey + "\r\n", 0400));
    REQUIRE(crlf.ok());
    CHECK(crlf->bytes() == kKey);
  }
  SECTION("a file others can read is refused, with the fix") {
    auto path = dir.write("k", kKey, 0644);
    auto key = auth::load_key_file(path);
    REQUIRE_FALSE(key.ok());
    CHECK_THAT(key.status().message(), Catch::Contains(path.string()) && Catch::Contains("chmod 600"));
  }
  SECTION("a short key is refused") {
    auto key = auth::load_key_file(dir.write("k", "short\n"));
    REQUIRE_FALSE(key.ok());
    CHECK_THAT(key.status().message(), Catch::Contains("5 bytes") && Catch::Contains("at least 16"));
  }
  SECTION("a long file is refused") {
    auto key = auth::load_key_file(dir.write("k", std::string(auth::kMaxKeyBytes + 10, 'x')));
    REQUIRE_FALSE(key.ok());
  }
  SECTION("a missing file says how to make one") {
    auto key = auth::load_key_file((dir.path / "nope").string());
    REQUIRE_FALSE(key.ok());
    CHECK_THAT(key.status().message(), Catch::Contains("/dev/urandom"));
  }
  SECTION("a directory is refused") {
    fs::create_directory(dir.path / "d");
    ::chmod((dir.path / "d").c_str(), 0700);
    CHECK_FALSE(auth::load_key_file((dir.path / "d").string()).ok());
  }
}

TEST_CASE("auth: where the key comes from") {
  TempDir dir;
  auto flag = dir.write("flag", "flag-key-flag-key-flag-key");
  auto env = dir.write("env", "env-key-env-key-env-key-env");
  fs::create_directory(dir.path / "creds");
  dir.write("creds/muster-auth-key", "cred-key-cred-key-cred-key");
  std::string creds = (dir.path / "creds").string();

  auto from_flag = auth::find_key(flag.string(), env.c_str(), creds.c_str());
  REQUIRE(from_flag.ok());
  REQUIRE(from_flag.value());
  CHECK(from_flag.value()->key.bytes() == "flag-key-flag-key-flag-key");
  CHECK(from_flag.value()->source == "--auth-key-file");

  auto from_env = auth::find_key("", env.c_str(), creds.c_str());
  REQUIRE(from_env.ok());
  CHECK(from_env.value()->key.bytes() == "env-key-env-key-env-key-env");

  auto from_creds = auth::find_key("", nullptr, creds.c_str());
  REQUIRE(from_creds.ok());
  CHECK(from_creds.value()->key.bytes() == "cred-key-cred-key-cred-key");

  auto none = auth::find_key("", "", dir.path.c_str());  // no credential of that name there
  REQUIRE(none.ok());
  CHECK_FALSE(none.value());

  auto bad = auth::find_key("", (dir.path / "missing").c_str(), nullptr);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::StartsWith("MUSTER_AUTH_KEY_FILE: "));
}

TEST_CASE("auth: the handshake's values depend on the key and both nonces") {
  auth::Key key(kKey);
  auto a = auth::derive(key, std::string(32, 'c'), std::string(32, 's'));
  CHECK(a.server_proof.size() == auth::kTagBytes);
  CHECK(a.server_proof != a.client_proof);
  CHECK(a.client_proof != a.session_key);
  CHECK(auth::derive(key, std::string(32, 'c'), std::string(32, 't')).client_proof != a.client_proof);
  CHECK(auth::derive(key, std::string(32, 'd'), std::string(32, 's')).client_proof != a.client_proof);
  CHECK(auth::derive(auth::Key(kKey + "x"), std::string(32, 'c'), std::string(32, 's')).client_proof !=
        a.client_proof);
}

TEST_CASE("auth: a channel refuses altered, replayed, reordered and reflected frames") {
  std::string session(32, 'k');
  auth::Channel client(session, auth::Channel::Side::client);
  auth::Channel server(session, auth::Channel::Side::server);
  std::string f0 = client.seal("{\"type\":\"join\"}");
  std::string f1 = client.seal("{\"type\":\"heartbeat\"}");
  CHECK(f0.size() == auth::kTagBytes + 15);

  SECTION("in order, both arrive") {
    auto m0 = server.open(f0);
    REQUIRE(m0.ok());
    CHECK(m0.value() == "{\"type\":\"join\"}");
    REQUIRE(server.open(f1).ok());
    // and the other way
    auto back = client.open(server.seal("{\"type\":\"assign\"}"));
    REQUIRE(back.ok());
    CHECK(back.value() == "{\"type\":\"assign\"}");
  }
  SECTION("altered") {
    std::string bad = f0;
    bad.back() = ']';
    auto m = server.open(bad);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == Code::auth_failed);
    CHECK_THAT(m.status().message(), Catch::Contains("failed authentication"));
  }
  SECTION("replayed") {
    REQUIRE(server.open(f0).ok());
    CHECK_FALSE(server.open(f0).ok());
  }
  SECTION("reordered") { CHECK_FALSE(server.open(f1).ok()); }
  SECTION("reflected back to its sender") { CHECK_FALSE(client.open(f0).ok()); }
  SECTION("under another session's key") {
    auth::Channel other(std::string(32, 'j'), auth::Channel::Side::server);
    CHECK_FALSE(other.open(f0).ok());
  }
  SECTION("too short for a tag") { CHECK_FALSE(server.open("{}").ok()); }
}

TEST_CASE("auth: handshake messages are decoded strictly") {
  std::string nonce(auth::kNonceBytes, '\x11');
  auto hello = hello_from_json(to_json(HelloMessage{nonce}));
  REQUIRE(hello.ok());
  CHECK(hello->nonce == nonce);
  json short_nonce = to_json(HelloMessage{nonce});
  short_nonce["nonce"] = "abcd";
  CHECK_FALSE(hello_from_json(short_nonce).ok());
  json no_nonce = {{"type", "hello"}, {"v", kProtocolVersion}};
  CHECK_THAT(hello_from_json(no_nonce).status().message(), Catch::Contains("\"nonce\" is missing"));
  auto challenge = challenge_from_json(to_json(ChallengeMessage{nonce, std::string(auth::kTagBytes, 'p'), std::nullopt}));
  REQUIRE(challenge.ok());
  CHECK(challenge->proof == std::string(auth::kTagBytes, 'p'));
  json bad_proof = to_json(AuthMessage{std::string(auth::kTagBytes, 'p')});
  bad_proof["proof"] = 12;
  CHECK_FALSE(auth_from_json(bad_proof).ok());
}

namespace {

// One server and one client in one loop, bounded: what the client heard.
struct Outcome {
  std::vector<json> messages;
  std::optional<Status> error;
  bool connected = false;
};

Outcome join_once(std::optional<auth::Key> server_key, std::optional<auth::Key> client_key) {
  boost::asio::io_context io;
  auto server = RendezvousServer::listen(io, "127.0.0.1", 0);
  REQUIRE(server.ok());
  if (server_key) server.value()->require_auth(*server_key);
  Outcome out;
  std::shared_ptr<RendezvousClient> client;
  client = std::make_shared<RendezvousClient>(
      io, "127.0.0.1", server.value()->port(),
      [&](const json& m) {
        out.messages.push_back(m);
        io.stop();
      },
      [&](const Status& st) {
        out.error = st;
        io.stop();
      },
      [&](const Status& st) {
        out.error = st;
        io.stop();
      });
  if (client_key) client->set_auth_key(*client_key);
  client->connect(std::chrono::seconds(20), [&] {
    out.connected = true;
    JoinMessage j;
    j.job = "job";
    j.request.node_name = "n1";
    j.request.address = "127.0.0.1";
    client->send(to_json(j));
  });
  io.run_for(std::chrono::seconds(20));
  client->close();
  server.value()->close();
  return out;
}

}  // namespace

TEST_CASE("auth: an agent with the server's key joins, and without it or with another it is refused") {
  auth::Key key(kKey);
  SECTION("both hold the key") {
    auto o = join_once(key, key);
    REQUIRE_FALSE(o.error);
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0]["type"] == "assign");
  }
  SECTION("neither holds one") {
    auto o = join_once(std::nullopt, std::nullopt);
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0]["type"] == "assign");
  }
  SECTION("the agent has no key") {
    auto o = join_once(key, std::nullopt);
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0]["type"] == "error");
    CHECK(o.messages[0]["code"] == "auth_failed");
    CHECK_THAT(o.messages[0]["message"].get<std::string>(), Catch::Contains("--auth-key-file"));
  }
  SECTION("the agent has another key") {
    auto o = join_once(key, auth::Key(kKey + "-other"));
    REQUIRE(o.error);
    CHECK_FALSE(o.connected);
    CHECK(o.error->code() == Code::auth_failed);
    CHECK_THAT(o.error->message(), Catch::Contains("does not hold this node's auth key"));
  }
  SECTION("the server has no key") {
    auto o = join_once(std::nullopt, key);
    CHECK_FALSE(o.connected);
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0]["type"] == "error");
    CHECK_THAT(o.messages[0]["message"].get<std::string>(), Catch::Contains("has no auth key"));
  }
}

namespace {

using muster::rendezvous::ClientHandshake;
using muster::rendezvous::ServerHandshake;

std::shared_ptr<const auth::Key> shared_key(const std::string& bytes) {
  return std::make_shared<const auth::Key>(bytes);
}

// Fixed bytes instead of the system's: the handshake is then the same every run.
ServerHandshake::Random fixed_random(char c) {
  return [c](std::size_t n) -> Result<std::string> { return std::string(n, c); };
}

}  // namespace

TEST_CASE("the handshake machines agree on a session key when both ends hold the key", "[auth]") {
  auto key = shared_key("0123456789abcdef-the-key");
  ServerHandshake server(key, nullptr, fixed_random('s'));
  ClientHandshake client(*key, std::string(auth::kNonceBytes, 'c'));
  CHECK_FALSE(server.challenged());
  auto challenge = server.on_message(client.hello());
  REQUIRE(challenge.ok());
  CHECK(challenge->reply["type"] == "challenge");
  CHECK(challenge->session_key.empty());
  CHECK(server.challenged());
  auto opened = client.on_challenge(challenge->reply);
  REQUIRE(opened.ok());
  auto done = server.on_message(opened->auth);
  REQUIRE(done.ok());
  CHECK(done->reply.is_null());
  CHECK(server.done());
  CHECK_FALSE(done->session_key.empty());
  CHECK(done->session_key == opened->session_key);
  // The channels they open talk to each other.
  auth::Channel a(opened->session_key, auth::Channel::Side::client);
  auth::Channel b(done->session_key, auth::Channel::Side::server);
  auto m = b.open(a.seal("join"));
  REQUIRE(m.ok());
  CHECK(m.value() == "join");
  // After it: no second handshake on the connection.
  auto again = server.on_message(client.hello());
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().code() == Code::auth_failed);
  CHECK_THAT(again.status().message(), Catch::Contains("already authenticated"));
}

TEST_CASE("the handshake machines refuse a wrong key at either end, and accept the rotated-out one", "[auth]") {
  auto key = shared_key("0123456789abcdef-the-key");
  auto other = shared_key("0123456789abcdef-another");
  SECTION("the server does not trust a client with another key") {
    ServerHandshake server(key, nullptr, fixed_random('s'));
    ClientHandshake client(*other, std::string(auth::kNonceBytes, 'c'));
    auto challenge = server.on_message(client.hello());
    REQUIRE(challenge.ok());
    // The client sees the server's proof is not under its key.
    auto opened = client.on_challenge(challenge->reply);
    REQUIRE_FALSE(opened.ok());
    CHECK_THAT(opened.status().message(), Catch::Contains("does not hold this node's auth key"));
    // A client that sends a proof anyway is refused.
    json forged = to_json(AuthMessage{std::string(auth::kTagBytes, 'x')});
    auto refused = server.on_message(forged);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == Code::auth_failed);
    CHECK_THAT(refused.status().message(), Catch::Contains("does not match this rendezvous's key"));
    CHECK_FALSE(server.done());
  }
  SECTION("while a key is rotated, a client with the previous key gets in, on that key's session") {
    ServerHandshake server(key, other, fixed_random('s'));
    ClientHandshake client(*other, std::string(auth::kNonceBytes, 'c'));
    auto challenge = server.on_message(client.hello());
    REQUIRE(challenge.ok());
    CHECK(challenge->reply.contains("previous_proof"));
    auto opened = client.on_challenge(challenge->reply);
    REQUIRE(opened.ok());
    auto done = server.on_message(opened->auth);
    REQUIRE(done.ok());
    CHECK(done->session_key == opened->session_key);
  }
}

TEST_CASE("the server's handshake takes messages only in their order", "[auth]") {
  auto key = shared_key("0123456789abcdef-the-key");
  ClientHandshake client(*key, std::string(auth::kNonceBytes, 'c'));
  SECTION("a join first") {
    ServerHandshake server(key, nullptr, fixed_random('s'));
    auto r = server.on_message(json{{"type", "join"}});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::auth_failed);
    CHECK_THAT(r.status().message(), Catch::Contains("requires authentication") && Catch::Contains("'join' first"));
  }
  SECTION("a second hello instead of the proof") {
    ServerHandshake server(key, nullptr, fixed_random('s'));
    REQUIRE(server.on_message(client.hello()).ok());
    auto r = server.on_message(client.hello());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("'hello' before the connection authenticated"));
  }
  SECTION("a malformed hello") {
    ServerHandshake server(key, nullptr, fixed_random('s'));
    auto r = server.on_message(json{{"type", "hello"}, {"nonce", "abc"}});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::invalid_argument);
  }
  SECTION("no randomness") {
    ServerHandshake server(key, nullptr,
                           [](std::size_t) -> Result<std::string> { return Status(Code::internal, "getrandom failed"); });
    auto r = server.on_message(client.hello());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::internal);
  }
  SECTION("the client refuses what is not a challenge") {
    auto r = client.on_challenge(json{{"type", "assign"}});
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("sent 'assign' where its challenge was due"));
  }
}
