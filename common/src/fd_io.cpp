#include "muster/common/fd_io.hpp"

#include <unistd.h>

#include <cerrno>

namespace muster {

bool write_fully(int fd, const char* data, std::size_t len) {
  while (len > 0) {
    ssize_t w = ::write(fd, data, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    len -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace muster
