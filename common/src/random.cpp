#include "muster/common/random.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace muster {

namespace {

// getrandom returns at most 32 MiB a call and may be interrupted by a signal
// before it has any: a bounded number of tries, never a loop without end.
constexpr int kMaxTries = 64;

}  // namespace

Status random_bytes(void* out, std::size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  for (int tries = 0; got < n && tries < kMaxTries; ++tries) {
    ssize_t r = getrandom(p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      int err = errno;
      return {Code::io_error, std::string("cannot read random bytes from the kernel (getrandom): ") + std::strerror(err),
              err};
    }
  }
  if (got < n) return {Code::io_error, "cannot read random bytes from the kernel (getrandom kept being interrupted)"};
  return {};
}

Result<std::string> random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (auto st = random_bytes(raw.data(), bytes); !st.ok()) return st;
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char b : raw) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

Result<std::string> random_uuid4() {
  unsigned char b[16];
  if (auto st = random_bytes(b, sizeof b); !st.ok()) return st;
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // the RFC 4122 variant
  char out[37];
  std::snprintf(out, sizeof out, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return std::string(out);
}

}  // namespace muster
