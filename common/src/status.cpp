#include "muster/common/status.hpp"

namespace muster {

const char* code_name(Code code) {
  switch (code) {
    case Code::ok: return "ok";
    case Code::invalid_argument: return "invalid_argument";
    case Code::not_found: return "not_found";
    case Code::already_exists: return "already_exists";
    case Code::timeout: return "timeout";
    case Code::unavailable: return "unavailable";
    case Code::closed: return "closed";
    case Code::auth_failed: return "auth_failed";
    case Code::io_error: return "io_error";
    case Code::internal: return "internal";
  }
  return "unknown";
}

}  // namespace muster
