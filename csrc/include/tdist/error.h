// One exception type and the check macros for the whole core. Messages name the rank, the
// operation and what the user can do about it; the Python bindings turn Error into RuntimeError.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tdist {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A timeout is an Error of its own so that callers (and tests) can tell a peer that never
// answered from a peer that answered wrongly.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// "triton_dist [rank 3] symmetric_allocate: <what>" — the prefix every message carries.
std::string error_prefix(int rank, const std::string& op);

}  // namespace tdist

// TDIST_CHECK(cond, rank, op, stream-expression): throws tdist::Error when cond is false.
#define TDIST_CHECK(cond, rank, op, what)                                         \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::ostringstream tdist_msg_;                                              \
      tdist_msg_ << ::tdist::error_prefix((rank), (op)) << what;                  \
      throw ::tdist::Error(tdist_msg_.str());                                     \
    }                                                                             \
  } while (0)

#define TDIST_FAIL(rank, op, what) TDIST_CHECK(false, rank, op, what)
