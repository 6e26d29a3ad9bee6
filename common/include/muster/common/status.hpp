// Errors as values at module boundaries: a Status with a canonical code and a
// message that says what failed, where, and what to do; Result<T> holds either.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace muster {

enum class Code {
  ok,
  invalid_argument,
  not_found,
  already_exists,
  timeout,
  unavailable,
  closed,
  auth_failed,
  io_error,
  internal,
};

const char* code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  // A failed system call: its errno rides along with the message that names it.
  Status(Code code, std::string message, int sys_errno)
      : code_(code), message_(std::move(message)), sys_errno_(sys_errno) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == Code::ok; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // The errno of the system call that failed, 0 when none did.
  int sys_errno() const { return sys_errno_; }

 private:
  Code code_ = Code::ok;
  std::string message_;
  int sys_errno_ = 0;
};

inline Status invalid_argument(std::string message) {
  return {Code::invalid_argument, std::move(message)};
}
inline Status io_error(std::string message) { return {Code::io_error, std::move(message)}; }

// What value() throws on a Result that holds an error: the error's message,
// not std::variant's "bad variant access". A caller that has not checked ok()
// has a bug; this makes it say which error it missed.
class BadResultAccess : public std::logic_error {
 public:
  explicit BadResultAccess(const std::string& message)
      : std::logic_error("value() of a Result holding an error: " + message) {}
};

// Holds a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(state_);
  }
  T& value() & {
    check();
    return std::get<T>(state_);
  }
  const T& value() const& {
    check();
    return std::get<T>(state_);
  }
  T&& value() && {
    check();
    return std::get<T>(std::move(state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check() const {
    if (!ok()) throw BadResultAccess(std::get<Status>(state_).message());
  }
  std::variant<T, Status> state_;
};

}  // namespace muster
