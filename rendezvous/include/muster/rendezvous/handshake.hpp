// The authentication handshake of a rendezvous connection, both ends, as
// state machines without I/O: auth.hpp has the cryptography, protocol.hpp
// the messages; the server's session and the client feed them what arrives
// and send what they answer (docs/protocol.md, "Authentication").
//
//   agent                          server
//   hello{nonce_a}          ->
//                           <-     challenge{nonce_s, proof_s[, previous_proof_s]}
//   auth{proof_a}           ->     (checked against the key, and the previous one
//                                   while a key is rotated)
//   every later frame tagged, both ways (auth::Channel, with session_key)
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "muster/common/status.hpp"
#include "muster/rendezvous/auth.hpp"

namespace muster::rendezvous {

class ServerHandshake {
 public:
  // n random bytes (auth::random_bytes; a test gives its own).
  using Random = std::function<Result<std::string>(std::size_t n)>;
  // key: the key the connection must prove; previous: the key being rotated
  // out, also accepted while set (may be null).
  ServerHandshake(std::shared_ptr<const auth::Key> key, std::shared_ptr<const auth::Key> previous,
                  Random random = auth::random_bytes);

  struct Step {
    nlohmann::json reply;     // to send, untagged; null when nothing is
    std::string session_key;  // set once the agent proved the key: the channel's
  };
  // The connection's next message before it authenticated. A Status ends the
  // connection: auth_failed (the wrong message or proof), invalid_argument (a
  // malformed one), internal (no randomness).
  Result<Step> on_message(const nlohmann::json& msg);
  bool done() const { return state_ == State::done; }
  // The challenge went out and no proof came yet: a connection that closes
  // now is most likely an agent with a different key.
  bool challenged() const { return state_ == State::await_auth; }

 private:
  enum class State { await_hello, await_auth, done };
  std::shared_ptr<const auth::Key> key_;
  std::shared_ptr<const auth::Key> previous_;
  Random random_;
  State state_ = State::await_hello;
  // What the agent's proof must be, and the session key that goes with it,
  // under the key and under the previous one.
  std::string client_proof_;
  std::string session_key_;
  std::string previous_client_proof_;
  std::string previous_session_key_;
};

class ClientHandshake {
 public:
  // nonce: auth::kNonceBytes random bytes, fresh for this connection.
  ClientHandshake(auth::Key key, std::string nonce);

  // The connection's first message.
  nlohmann::json hello() const;
  struct Opened {
    nlohmann::json auth;  // to send, untagged
    std::string session_key;
  };
  // The server's answer to the hello. A Status (auth_failed) says what is
  // wrong with the server, to follow "the rendezvous at <address> ".
  Result<Opened> on_challenge(const nlohmann::json& msg);

 private:
  auth::Key key_;
  std::string nonce_;
};

}  // namespace muster::rendezvous
