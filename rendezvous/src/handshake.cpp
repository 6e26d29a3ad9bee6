#include "muster/rendezvous/handshake.hpp"

#include "muster/common/text.hpp"
#include "muster/rendezvous/protocol.hpp"

namespace muster::rendezvous {

ServerHandshake::ServerHandshake(std::shared_ptr<const auth::Key> key, std::shared_ptr<const auth::Key> previous,
                                 Random random)
    : key_(std::move(key)), previous_(std::move(previous)), random_(std::move(random)) {}

Result<ServerHandshake::Step> ServerHandshake::on_message(const nlohmann::json& msg) {
  const std::string& type = msg["type"].get_ref<const std::string&>();
  switch (state_) {
    case State::await_hello: {
      if (type != "hello") {
        return Status(Code::auth_failed, "this rendezvous requires authentication and the connection sent '" +
                                             log_excerpt(type, 64) +
                                             "' first: give this client (the agent, or musterctl) the rendezvous's "
                                             "key with --auth-key-file (or MUSTER_AUTH_KEY_FILE)");
      }
      auto hello = hello_from_json(msg);
      if (!hello.ok()) return Status(Code::invalid_argument, hello.status().message());
      auto nonce = random_(auth::kNonceBytes);
      if (!nonce.ok()) return Status(Code::internal, nonce.status().message());
      auto derived = auth::derive(*key_, hello->nonce, nonce.value());
      client_proof_ = std::move(derived.client_proof);
      session_key_ = std::move(derived.session_key);
      ChallengeMessage challenge{nonce.value(), derived.server_proof, std::nullopt};
      if (previous_) {
        auto old = auth::derive(*previous_, hello->nonce, nonce.value());
        previous_client_proof_ = std::move(old.client_proof);
        previous_session_key_ = std::move(old.session_key);
        challenge.previous_proof = std::move(old.server_proof);
      }
      state_ = State::await_auth;
      return Step{to_json(challenge), {}};
    }
    case State::await_auth: {
      if (type != "auth") {
        return Status(Code::auth_failed, "'" + log_excerpt(type, 64) + "' before the connection authenticated");
      }
      auto proof = auth_from_json(msg);
      if (!proof.ok()) return Status(Code::invalid_argument, proof.status().message());
      // Both comparisons are made, so the time taken does not say which key matched.
      const bool current = auth::same(proof->proof, client_proof_);
      const bool previous = !previous_client_proof_.empty() && auth::same(proof->proof, previous_client_proof_);
      if (!current && !previous) {
        return Status(Code::auth_failed,
                      "authentication failed: the agent's proof does not match this rendezvous's key; give the "
                      "rendezvous and every agent the same --auth-key-file");
      }
      Step step{nullptr, current ? std::move(session_key_) : std::move(previous_session_key_)};
      client_proof_.clear();
      previous_client_proof_.clear();
      session_key_.clear();
      previous_session_key_.clear();
      state_ = State::done;
      return step;
    }
    case State::done:
      break;
  }
  return Status(Code::auth_failed, "'" + log_excerpt(type, 64) + "' on a connection that has already authenticated");
}

ClientHandshake::ClientHandshake(auth::Key key, std::string nonce)
    : key_(std::move(key)), nonce_(std::move(nonce)) {}

nlohmann::json ClientHandshake::hello() const { return to_json(HelloMessage{nonce_}); }

Result<ClientHandshake::Opened> ClientHandshake::on_challenge(const nlohmann::json& msg) {
  const std::string& type = msg["type"].get_ref<const std::string&>();
  if (type != "challenge") {
    return Status(Code::auth_failed, "sent '" + log_excerpt(type, 64) + "' where its challenge was due");
  }
  auto challenge = challenge_from_json(msg);
  if (!challenge.ok()) return Status(Code::auth_failed, "sent a bad challenge: " + challenge.status().message());
  auto derived = auth::derive(key_, nonce_, challenge->nonce);
  // During a key rotation the server proves both keys; either may be this node's.
  const bool matches = auth::same(challenge->proof, derived.server_proof);
  const bool matches_previous =
      challenge->previous_proof && auth::same(*challenge->previous_proof, derived.server_proof);
  if (!matches && !matches_previous) {
    return Status(Code::auth_failed,
                  "does not hold this node's auth key (its proof does not match): give the rendezvous and every "
                  "agent the same --auth-key-file");
  }
  return Opened{to_json(AuthMessage{derived.client_proof}), std::move(derived.session_key)};
}

}  // namespace muster::rendezvous
