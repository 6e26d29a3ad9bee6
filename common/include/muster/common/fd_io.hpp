// Writing to a file descriptor until done, across short writes and EINTR.
#pragma once

#include <cstddef>

namespace muster {

// Returns false if a write failed (the rest is dropped).
bool write_fully(int fd, const char* data, std::size_t len);

}  // namespace muster
