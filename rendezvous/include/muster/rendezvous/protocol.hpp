// The rendezvous wire format: frames of a 4-byte big-endian length and that
// many bytes of JSON, at most 1 MiB; every message has "type" and protocol
// version "v". docs/protocol.md is the reference for every message.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "muster/common/status.hpp"
#include "muster/rendezvous/core.hpp"

namespace muster::rendezvous {

constexpr int kProtocolVersion = 1;
constexpr std::size_t kMaxFrame = 1024 * 1024;

std::string encode_frame(const nlohmann::json& message);

// Accumulates bytes and hands out whole frames.
class FrameReader {
 public:
  void feed(std::string_view bytes) { buffer_.append(bytes); }
  // A frame's payload; nullopt when incomplete; a Status when the stream is
  // broken (oversized frame).
  Result<std::optional<std::string>> next();

 private:
  std::string buffer_;
  std::size_t offset_ = 0;
};

// Parses a frame's payload; checks "type" (a string) and "v" (this version).
Result<nlohmann::json> parse_message(std::string_view payload);

// What an agent asks for when it joins a job.
struct JoinMessage {
  std::string job;
  JoinRequest request;
  Settings settings;
};

nlohmann::json to_json(const JoinMessage& m);
Result<JoinMessage> join_from_json(const nlohmann::json& j);
nlohmann::json to_json(const FailureInfo& f);
Result<FailureInfo> failure_from_json(const nlohmann::json& j);
// The server's messages to a member (the member field is not sent).
nlohmann::json to_json(const Output& o);
nlohmann::json error_message(Code code, const std::string& message);

}  // namespace muster::rendezvous
