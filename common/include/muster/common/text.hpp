// Text from elsewhere (a peer, a worker, a file) made safe to show.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace muster {

// For one log line or a terminal: control bytes escaped (\x0a), cut to
// `limit` bytes with the original length said.
std::string log_excerpt(std::string_view text, std::size_t limit = 200);

}  // namespace muster
