// For the unit tests: everything readable on a descriptor now (non-blocking,
// or at end of file), shared by the tests that read back what a writer wrote.
#pragma once

#include <unistd.h>

#include <string>

inline std::string read_available(int fd) {
  std::string got;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return got;
    got.append(buf, static_cast<std::size_t>(n));
  }
}
