// PyTorch's TCPStore wire protocol, both dialects: torch 2.2 on (opens with
// VALIDATE, renumbered queries, PING) and torch before it (1.13: no handshake,
// the old numbering, WATCH_KEY on a callback connection). Integers are
// little-endian; strings are a u64 length and the bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace muster::store {

// How a connection numbers its queries.
//   with_validate: torch 2.2 and later. VALIDATE comes first, then the
//     numbering it brought (PING, queues, LIST_KEYS, BARRIER since).
//   before_validate: torch before VALIDATE: 1.13's queries 0-8 (WATCH_KEY at
//     7), and APPEND, MULTI_GET, MULTI_SET and CANCEL_WAIT at 9-12, which
//     torch 2.0 and 2.1 added. A server reads a connection that does not open
//     with VALIDATE this way; a client must not send a server queries it does
//     not answer (ServerGeneration).
enum class Dialect { before_validate, with_validate };

// What a query asks, whatever its dialect's tag.
enum class Op {
  validate,
  set,
  compare_set,
  get,
  add,
  check,
  wait,
  num_keys,
  watch_key,
  delete_key,
  append,
  multi_get,
  multi_set,
  cancel_wait,
  ping,
  queue_push,
  queue_pop,
  queue_len,
  list_keys,
  barrier,
};

constexpr uint32_t kValidateMagic = 0x3C85F7CE;

// One-byte replies.
constexpr uint8_t kReady = 0;         // CHECK
constexpr uint8_t kNotReady = 1;      // CHECK
constexpr uint8_t kStopWaiting = 0;   // WAIT, BARRIER
constexpr uint8_t kWaitCanceled = 1;  // CANCEL_WAIT
// 1.13 WATCH_KEY notifications.
constexpr uint8_t kKeyUpdated = 0;
constexpr uint8_t kKeyCreated = 1;
constexpr uint8_t kKeyDeleted = 2;
constexpr uint8_t kWatchRegistered = 3;

// Limits a server enforces (at least what PyTorch's own server accepts).
constexpr std::size_t kMaxKeyLength = 64 * 1024;
constexpr std::size_t kMaxValueLength = 256 * 1024 * 1024;
// Keys in one CHECK, WAIT, MULTI_GET or MULTI_SET: torch's own server's limit,
// which keeps the work of one request (and so the pause it causes others) small.
constexpr std::size_t kMaxKeyCount = 128 * 1024;
// All the strings of one request together (a MULTI_SET of large values).
constexpr std::size_t kMaxRequestBytes = 512 * 1024 * 1024;
// One reply (a MULTI_GET naming large values, LIST_KEYS): past it the request is refused.
constexpr std::size_t kMaxReplyBytes = 512 * 1024 * 1024;
// Keys one connection may wait on at once, over all its WAITs and BARRIERs
// (a torch client has one WAIT outstanding; a 1.13 client's timed-out ones stay).
constexpr std::size_t kMaxWaitedKeysPerConnection = 2 * kMaxKeyCount;
// 1.13 WATCH_KEY registrations of one connection.
constexpr std::size_t kMaxWatchesPerConnection = 4096;

// The TCPStore servers a client may meet, by the queries they answer (the
// version boundaries are approximate: they come from the dates of the changes).
enum class ServerGeneration {
  torch_1_13,  // no handshake; SET to DELETE_KEY (tags 0-8)
  torch_2_0,   // no handshake; and APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT
  torch_2_2,   // VALIDATE, PING and the rest; muster's own server answers all
};
Dialect dialect_of(ServerGeneration g);
bool server_answers(ServerGeneration g, Op op);

std::optional<Op> op_from_tag(Dialect d, uint8_t tag);
uint8_t tag_of(Dialect d, Op op);  // 0xff when the dialect has no such query
const char* op_name(Op op);

struct Request {
  Op op = Op::set;
  std::vector<std::string> keys;    // keys, or the queue / counter name
  std::vector<std::string> values;  // SET/APPEND: 1; CAS: expected, desired; MULTI_SET: n
  int64_t number = 0;               // ADD delta, BARRIER world size
  uint32_t u32 = 0;                 // VALIDATE magic, PING nonce
};

enum class ParseStatus { complete, incomplete, invalid };

struct ParseResult {
  ParseStatus status = ParseStatus::incomplete;
  std::size_t consumed = 0;
  std::string error;  // for invalid
};

// Parses requests from a byte stream incrementally: each call takes what it
// can of `data` (the bytes not consumed so far), keeps a partly read request
// between calls, and never looks at a byte twice, so a request of any size
// costs O(its size) however it is cut. `consumed` counts the bytes taken in
// this call, complete or not; the caller drops them.
class RequestParser {
 public:
  explicit RequestParser(Dialect d) : dialect_(d) {}
  ParseResult next(std::string_view data, Request& out);
  // Bytes held of a request not yet complete.
  std::size_t partial_bytes() const { return total_; }

 private:
  enum class Stage { tag, fixed, count, items, done };
  Dialect dialect_;
  Stage stage_ = Stage::tag;
  Request req_;
  int field_ = 0;         // fixed part: which field is next
  uint64_t count_ = 0;    // list part: how many items
  std::size_t item_ = 0;  // list part: the next item
  bool item_value_ = false;  // MULTI_SET: the next string is the item's value
  std::size_t total_ = 0;
};

// Parses one request from the front of data, on its own (consumed is 0 while
// the request is incomplete). Never reads past data.
ParseResult parse_request(Dialect d, std::string_view data, Request& out);

// Encoding helpers (little-endian, as every PyTorch build on x86-64/aarch64).
void put_u8(std::string& out, uint8_t v);
void put_u32(std::string& out, uint32_t v);
void put_i64(std::string& out, int64_t v);
void put_u64(std::string& out, uint64_t v);
void put_string(std::string& out, std::string_view s);

// The encoding of a request, as a client sends it.
std::string encode_request(Dialect d, const Request& r);

}  // namespace muster::store
