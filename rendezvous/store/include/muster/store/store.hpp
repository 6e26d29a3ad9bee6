// What a key-value store offers the code that uses it, whoever serves it:
// StoreClient (a TCPStore server, over a socket) and LocalStore (a StoreState
// in this process, shared by its threads). The process group takes a Store;
// one contract test runs against both.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::store {

class Store {
 public:
  virtual ~Store() = default;

  virtual Status set(const std::string& key, std::string_view value) = 0;
  // Waits for the key (up to the store's timeout), then reads it.
  virtual Result<std::string> get(const std::string& key) = 0;
  // Adds delta to the key's counter (a missing key counts as 0); the new value.
  virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
  // Sets desired if the key holds expected (or is missing and expected is
  // empty); the value the key holds afterwards (torch's answers, edge cases too).
  virtual Result<std::string> compare_set(const std::string& key, std::string_view expected,
                                          std::string_view desired) = 0;
  // Whether every key exists, without waiting.
  virtual Result<bool> check(const std::vector<std::string>& keys) = 0;
  // Until every key exists: the store's timeout, or the one given.
  virtual Status wait(const std::vector<std::string>& keys) = 0;
  virtual Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual Result<int64_t> num_keys() = 0;
  // Whether the key existed.
  virtual Result<bool> delete_key(const std::string& key) = 0;
  virtual Status append(const std::string& key, std::string_view value) = 0;
  // Waits for every key, then reads them all.
  virtual Result<std::vector<std::string>> multi_get(const std::vector<std::string>& keys) = 0;
  virtual Status multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) = 0;
};

}  // namespace muster::store
