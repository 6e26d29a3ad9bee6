// Authentication of the rendezvous control plane with a shared secret
// (docs/protocol.md, "Authentication").
//
// A connection proves knowledge of the key in both directions before any
// message is acted on: the agent sends a fresh nonce (hello), the server
// answers with a nonce of its own and its proof (challenge), the agent checks
// that proof and sends its own (auth). Each proof is an HMAC-SHA256 under the
// key of a label and both nonces, so no proof is valid on another connection
// or in the other direction. Every later frame, both ways, carries an
// HMAC-SHA256 tag under a key derived from the same nonces, over its
// direction, its sequence number and its bytes: a frame that is altered,
// replayed, reordered or injected fails its tag and ends the connection.
// Tags and proofs are compared in constant time; the cryptography is
// OpenSSL's libcrypto.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "muster/common/status.hpp"

namespace muster::rendezvous::auth {

constexpr std::size_t kMinKeyBytes = 16;    // shorter keys are refused
constexpr std::size_t kMaxKeyBytes = 4096;  // a key file longer than this is refused
constexpr std::size_t kNonceBytes = 32;
constexpr std::size_t kTagBytes = 32;       // HMAC-SHA256

// The name of the key in systemd's credentials directory (LoadCredential=).
constexpr const char* kCredentialName = "muster-auth-key";

// The shared secret; its bytes are wiped when it goes.
class Key {
 public:
  explicit Key(std::string bytes) : bytes_(std::move(bytes)) {}
  Key(const Key& other) = default;
  Key& operator=(const Key& other) = default;
  ~Key();
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Reads a key file: its bytes, less one trailing newline (or CR LF). Refused
// with a message naming the file: missing, unreadable, not a regular file,
// readable or writable by other users (chmod 600 or 400), shorter than
// kMinKeyBytes or longer than kMaxKeyBytes.
Result<Key> load_key_file(const std::string& path);

// Where a process takes its key from, first match: the flag's path, the
// MUSTER_AUTH_KEY_FILE path, systemd's $CREDENTIALS_DIRECTORY/muster-auth-key
// when that file exists. None of them: no key (nullopt). `source` says
// which one was used, for the log.
struct FoundKey {
  Key key;
  std::string source;
};
Result<std::optional<FoundKey>> find_key(const std::string& flag_path, const char* env_path,
                                         const char* credentials_directory);

// `n` random bytes from the system's generator.
Result<std::string> random_bytes(std::size_t n);

std::string to_hex(std::string_view bytes);
// Exactly `bytes` bytes in lower- or upper-case hex; nullopt otherwise.
std::optional<std::string> from_hex(std::string_view hex, std::size_t bytes);

// HMAC-SHA256 of the concatenation of `parts` under `key`.
std::string hmac(std::string_view key, std::initializer_list<std::string_view> parts);
// Equal length and bytes, in time that depends on the length only.
bool same(std::string_view a, std::string_view b);

// What both ends derive from the key and the two nonces.
struct Handshake {
  std::string server_proof;
  std::string client_proof;
  std::string session_key;
};
Handshake derive(const Key& key, std::string_view client_nonce, std::string_view server_nonce);

// One end of an authenticated connection: seals what it sends (tag, then the
// payload) and opens what it receives, each direction with its own sequence.
class Channel {
 public:
  enum class Side { client, server };
  Channel(std::string session_key, Side side);
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel();

  // The frame payload for `message`: its tag followed by its bytes.
  std::string seal(std::string_view message);
  // The message inside a received frame payload; an auth_failed Status when
  // the tag is missing or wrong (the frame was altered, replayed, reordered
  // or is not from the peer).
  Result<std::string> open(std::string_view frame_payload);

 private:
  std::string tag(char direction, uint64_t seq, std::string_view message) const;
  std::string key_;
  char out_direction_;
  char in_direction_;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
};

}  // namespace muster::rendezvous::auth
