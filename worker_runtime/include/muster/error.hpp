// What libmuster throws: every failure is a muster::Error (its message says
// which rank, which operation and why); running past a timeout is the
// TimeoutError kind of it.
#pragma once

#include <stdexcept>

#include "muster/export.hpp"

namespace muster {

class MUSTER_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A collective or the group's set-up ran past the group's timeout.
class MUSTER_API TimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace muster
