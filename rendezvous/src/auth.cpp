#include "muster/rendezvous/auth.hpp"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "muster/net/unique_fd.hpp"

namespace muster::rendezvous::auth {

namespace {

// Labels keep the three values apart: a proof is never another proof or the
// session key, whichever nonces an attacker picks.
constexpr std::string_view kServerLabel{"muster-rdzv-auth-1 server proof", 31};
constexpr std::string_view kClientLabel{"muster-rdzv-auth-1 client proof", 31};
constexpr std::string_view kSessionLabel{"muster-rdzv-auth-1 session key", 30};

struct MacDeleter {
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

EVP_MAC* hmac_algorithm() {
  // Fetched once; thread-safe by the static's initialisation.
  static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) throw std::runtime_error("OpenSSL has no HMAC implementation");
  return mac;
}

}  // namespace

Key::~Key() { OPENSSL_cleanse(bytes_.data(), bytes_.size()); }

Result<Key> load_key_file(const std::string& path) {
  auto fail = [&](const std::string& why) {
    return Status(Code::invalid_argument, "the auth key file " + path + " " + why);
  };
  // O_NONBLOCK: a FIFO at the path must not hang the caller before the check below.
  net::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd) {
    return fail(std::string("cannot be read: ") + std::strerror(errno) +
                "; create it with: head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail(std::string("cannot be examined: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail("is not a regular file");
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    return fail("can be read or written by other users; make it private with chmod 600 " + path);
  }
  if (st.st_size > static_cast<off_t>(kMaxKeyBytes + 2)) {
    return fail("holds " + std::to_string(st.st_size) + " bytes, more than a key of at most " +
                std::to_string(kMaxKeyBytes));
  }
  std::string bytes(static_cast<std::size_t>(kMaxKeyBytes + 3), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::read(fd.get(), bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      OPENSSL_cleanse(bytes.data(), bytes.size());
      return fail(std::string("cannot be read: ") + std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  std::size_t len = got;
  if (len > 0 && bytes[len - 1] == '\n') --len;
  if (len > 0 && bytes[len - 1] == '\r') --len;
  Key key(bytes.substr(0, len));
  OPENSSL_cleanse(bytes.data(), bytes.size());
  if (len > kMaxKeyBytes) {
    return fail("holds more than " + std::to_string(kMaxKeyBytes) + " bytes, the longest key muster takes");
  }
  if (len < kMinKeyBytes) {
    return fail("holds " + std::to_string(len) + " bytes; a key has at least " + std::to_string(kMinKeyBytes) +
                " (head -c 32 /dev/urandom | base64 makes one)");
  }
  return key;
}

Result<std::optional<FoundKey>> find_key(const std::string& flag_path, const char* env_path,
                                         const char* credentials_directory) {
  auto load = [](const std::string& path, std::string source) -> Result<std::optional<FoundKey>> {
    auto key = load_key_file(path);
    if (!key.ok()) return Status(key.status().code(), source + ": " + key.status().message());
    return std::optional<FoundKey>(FoundKey{std::move(key.value()), std::move(source)});
  };
  if (!flag_path.empty()) return load(flag_path, "--auth-key-file");
  if (env_path != nullptr && env_path[0] != '\0') return load(env_path, "MUSTER_AUTH_KEY_FILE");
  if (credentials_directory != nullptr && credentials_directory[0] != '\0') {
    std::string path = std::string(credentials_directory) + "/" + kCredentialName;
    if (::access(path.c_str(), F_OK) == 0) return load(path, "the systemd credential " + std::string(kCredentialName));
  }
  return std::optional<FoundKey>{};
}

Result<std::string> random_bytes(std::size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return Status(Code::internal, "the system's random number generator failed");
  }
  return out;
}

std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

std::optional<std::string> from_hex(std::string_view hex, std::size_t bytes) {
  if (hex.size() != bytes * 2) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) {
    int hi = digit(hex[2 * i]);
    int lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

std::string hmac(std::string_view key, std::initializer_list<std::string_view> parts) {
  std::unique_ptr<EVP_MAC_CTX, MacDeleter> ctx(EVP_MAC_CTX_new(hmac_algorithm()));
  if (!ctx) throw std::runtime_error("OpenSSL could not make an HMAC context");
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_END};
  if (EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) != 1) {
    throw std::runtime_error("OpenSSL could not start an HMAC-SHA256");
  }
  for (std::string_view p : parts) {
    if (EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(p.data()), p.size()) != 1) {
      throw std::runtime_error("OpenSSL's HMAC-SHA256 failed");
    }
  }
  std::string out(kTagBytes, '\0');
  std::size_t len = 0;
  if (EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) != 1 ||
      len != kTagBytes) {
    throw std::runtime_error("OpenSSL's HMAC-SHA256 failed");
  }
  return out;
}

bool same(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Handshake derive(const Key& key, std::string_view client_nonce, std::string_view server_nonce) {
  return Handshake{hmac(key.bytes(), {kServerLabel, client_nonce, server_nonce}),
                   hmac(key.bytes(), {kClientLabel, client_nonce, server_nonce}),
                   hmac(key.bytes(), {kSessionLabel, client_nonce, server_nonce})};
}

Channel::Channel(std::string session_key, Side side)
    : key_(std::move(session_key)),
      out_direction_(side == Side::client ? 'C' : 'S'),
      in_direction_(side == Side::client ? 'S' : 'C') {}

Channel::~Channel() { OPENSSL_cleanse(key_.data(), key_.size()); }

std::string Channel::tag(char direction, uint64_t seq, std::string_view message) const {
  char header[9];
  header[0] = direction;
  for (int i = 0; i < 8; ++i) header[1 + i] = static_cast<char>((seq >> (56 - 8 * i)) & 0xff);
  return hmac(key_, {std::string_view(header, sizeof header), message});
}

std::string Channel::seal(std::string_view message) {
  std::string out = tag(out_direction_, sent_++, message);
  out.append(message);
  return out;
}

Result<std::string> Channel::open(std::string_view frame_payload) {
  if (frame_payload.size() < kTagBytes) {
    return Status(Code::auth_failed, "a frame of " + std::to_string(frame_payload.size()) +
                                         " bytes is shorter than its authentication tag");
  }
  std::string_view message = frame_payload.substr(kTagBytes);
  if (!same(frame_payload.substr(0, kTagBytes), tag(in_direction_, received_, message))) {
    return Status(Code::auth_failed,
                  "frame " + std::to_string(received_) +
                      " failed authentication (altered, replayed, reordered or not from the peer)");
  }
  ++received_;
  return std::string(message);
}

}  // namespace muster::rendezvous::auth
