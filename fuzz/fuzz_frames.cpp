// libFuzzer target: the rendezvous frame reader, the message parser and every
// message decoder, both directions. A decoded join must encode and decode to
// the same join.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "muster/rendezvous/protocol.hpp"

using namespace muster::rendezvous;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FrameReader reader;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  // Fed in two pieces, as a socket may cut it.
  std::size_t cut = size > 0 ? data[0] % (size + 1) : 0;
  reader.feed(input.substr(0, cut));
  reader.feed(input.substr(cut));
  for (int frames = 0; frames < 64; ++frames) {
    auto frame = reader.next();
    if (!frame.ok() || !frame.value()) break;
    auto msg = parse_message(*frame.value());
    if (!msg.ok()) continue;
    const auto& j = msg.value();
    if (auto join = join_from_json(j); join.ok()) {
      auto again = join_from_json(to_json(join.value()));
      if (!again.ok() || again->job != join->job || again->request.local_world_size != join->request.local_world_size) {
        __builtin_trap();
      }
    }
    (void)workers_failed_from_json(j);
    (void)workers_succeeded_from_json(j);
    if (auto s = server_message_from_json(j); s.ok()) (void)encode_frame(j);
  }
  return 0;
}
