// What libmuster throws: every failure is a muster::Error (its message says
// which rank, which operation and why); running past a timeout is the
// TimeoutError kind of it.
#pragma once

#include <stdexcept>

namespace muster {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A collective or the group's set-up ran past the group's timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace muster
