// A Store in this process: a StoreState behind a mutex, shared by threads (as
// gloo's HashStore is). Every call is a request of its own to the state, and
// its reply is decoded as a client would, so the semantics are exactly the
// server's. A wait parks its thread until the request's reply arrives (another
// thread's set completes it) or the timeout passes (the wait is dropped).
#pragma once

#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "muster/store/state.hpp"
#include "muster/store/store.hpp"

namespace muster::store {

class LocalStore final : public Store {
 public:
  explicit LocalStore(std::chrono::milliseconds timeout = std::chrono::minutes(5)) : timeout_(timeout) {}

  Status set(const std::string& key, std::string_view value) override;
  Result<std::string> get(const std::string& key) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Result<std::string> compare_set(const std::string& key, std::string_view expected,
                                  std::string_view desired) override;
  Result<bool> check(const std::vector<std::string>& keys) override;
  Status wait(const std::vector<std::string>& keys) override { return wait(keys, timeout_); }
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> num_keys() override;
  Result<bool> delete_key(const std::string& key) override;
  Status append(const std::string& key, std::string_view value) override;
  Result<std::vector<std::string>> multi_get(const std::vector<std::string>& keys) override;
  Status multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;

  // Waits that threads are parked in now.
  std::size_t pending_waits();

 private:
  // Runs one request; its reply bytes (empty for requests without one), once
  // they come, or a timeout status after `timeout`.
  Result<std::string> run(Request req, std::chrono::milliseconds timeout);
  Result<std::string> run(Request req) { return run(std::move(req), timeout_); }

  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  StoreState state_;                                // guarded by mutex_
  ConnId next_conn_ = 1;                            // guarded by mutex_
  std::unordered_map<ConnId, std::string> mailbox_;  // replies not yet taken; guarded by mutex_
};

}  // namespace muster::store
