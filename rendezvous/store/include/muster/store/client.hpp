// A blocking TCPStore client that speaks to PyTorch's servers and to muster's:
// the torch 2.x dialect (VALIDATE + PING on connect, CANCEL_WAIT on a wait
// timeout) or the 1.13 one. Keys get TCPStore's "/" prefix, so a key set here
// is the key a PyTorch client of the same store sees. Every call is bounded by
// the client's timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "muster/common/status.hpp"
#include "muster/net/unique_fd.hpp"
#include "muster/store/protocol.hpp"
#include "muster/store/store.hpp"

namespace muster::store {

struct ClientOptions {
  // The server's generation decides the dialect, and which calls are sent,
  // emulated (MULTI_GET, MULTI_SET on 1.13: one GET or SET per key) or refused
  // (APPEND on 1.13).
  ServerGeneration server = ServerGeneration::torch_2_2;
  std::chrono::milliseconds timeout{300000};  // connect deadline and per-call bound
};

class StoreClient final : public Store {
 public:
  static Result<StoreClient> connect(const std::string& host, int port, ClientOptions options = {});
  StoreClient(StoreClient&& other) noexcept;
  StoreClient& operator=(StoreClient&& other) noexcept;
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;
  ~StoreClient() override;

  Status set(const std::string& key, std::string_view value) override;
  // Waits for the key (up to the timeout), then reads it.
  Result<std::string> get(const std::string& key) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Result<std::string> compare_set(const std::string& key, std::string_view expected, std::string_view desired) override;
  Result<bool> check(const std::vector<std::string>& keys) override;
  Status wait(const std::vector<std::string>& keys) override;
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> num_keys() override;
  Result<bool> delete_key(const std::string& key) override;
  // Not on a torch 1.13 server (invalid_argument, nothing sent).
  Status append(const std::string& key, std::string_view value) override;
  Result<std::vector<std::string>> multi_get(const std::vector<std::string>& keys) override;
  Status multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;

  const std::string& address() const { return address_; }
  // This end's IP address on the connection (how peers that reach the store
  // can reach this host), numeric; "" when not connected.
  std::string local_host() const;

 private:
  StoreClient() = default;
  Status send(const Request& r);
  Status recv_exact(char* out, std::size_t n, std::chrono::steady_clock::time_point deadline);
  Result<std::string> recv_string(std::chrono::steady_clock::time_point deadline);
  Result<int64_t> recv_i64(std::chrono::steady_clock::time_point deadline);
  Result<uint8_t> recv_u8(std::chrono::steady_clock::time_point deadline, bool keep_on_timeout = false);
  std::chrono::steady_clock::time_point deadline() const;
  Status broken(Status why);
  std::string key(const std::string& k) const { return "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;

  net::UniqueFd fd_;
  ClientOptions options_;
  std::string address_;
};

}  // namespace muster::store
