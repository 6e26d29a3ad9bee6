// Random identifiers (run ids, agent instance ids, unique folder and segment
// names) from the kernel's generator, getrandom(2): checked, so that a failure
// is an error and never an all-zero or predictable id.
#pragma once

#include <cstddef>
#include <string>

#include "muster/common/status.hpp"

namespace muster {

// Fills out with n random bytes.
Status random_bytes(void* out, std::size_t n);
// 2 x bytes lower-case hex digits.
Result<std::string> random_hex(std::size_t bytes);
// An RFC 4122 version 4 UUID, as Python's str(uuid.uuid4()).
Result<std::string> random_uuid4();

}  // namespace muster
