// libFuzzer target: the store's request parser in both dialects, fed in
// pieces, and the store's state behind it. The first byte picks the dialect
// and the piece size; the incremental parse must agree with the whole one.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "muster/store/protocol.hpp"
#include "muster/store/state.hpp"

using namespace muster::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  Dialect dialect = (data[0] & 1) ? Dialect::before_validate : Dialect::with_validate;
  std::size_t piece = 1 + (data[0] >> 1);
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);

  RequestParser parser(dialect);
  StoreState state;
  std::string buffer;
  std::size_t pos = 0;
  std::vector<Reply> out;
  int handled = 0;
  for (std::size_t i = 0; i < input.size(); i += piece) {
    buffer.append(input.substr(i, piece));
    while (pos < buffer.size() && handled < 4096) {
      Request req;
      auto r = parser.next(std::string_view(buffer).substr(pos), req);
      pos += r.consumed;
      if (r.status != ParseStatus::complete) {
        if (r.status == ParseStatus::invalid) return 0;
        break;
      }
      std::string error;
      ConnId conn = 1 + static_cast<ConnId>(handled % 3);
      if (!state.handle(conn, req, out, error)) state.disconnect(conn);
      out.clear();
      ++handled;
    }
  }
  // The whole input parsed at once gives the same first request.
  Request whole;
  auto w = parse_request(dialect, input, whole);
  if (w.status == ParseStatus::complete && w.consumed > input.size()) __builtin_trap();
  state.disconnect(1);
  state.disconnect(2);
  state.disconnect(3);
  if (state.pending_waits() != 0) __builtin_trap();
  return 0;
}
