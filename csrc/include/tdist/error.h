// One exception type and the check macros for the whole core. Messages name the rank, the
// operation and what the user can do about it; the Python bindings turn Error into RuntimeError.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tdist {

// Every failure of the core: the message names the rank, the operation and the fix.
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

// Builds messages with `<<` without iostreams: std::ostream's number formatting goes through
// locale facets, which crashed in processes that also load a statically linked C++ runtime (seen
// on the GPU machine with Triton and torch loaded, 2026-11-29).
class Message {
 public:
  // Appends `s`.
  Message& operator<<(const std::string& s) { text_ += s; return *this; }
  // Appends `s` ("(null)" for a null pointer).
  Message& operator<<(const char* s) { text_ += s ? s : "(null)"; return *this; }
  // Appends one character.
  Message& operator<<(char c) { text_ += c; return *this; }
  // Appends "true" or "false".
  Message& operator<<(bool b) { text_ += b ? "true" : "false"; return *this; }
  // Appends an integer in decimal.
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
  Message& operator<<(T value) { text_ += std::to_string(value); return *this; }
  // Appends a number with three significant digits.
  Message& operator<<(double value) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3g", value);
    text_ += buf;
    return *this;
  }
  // Appends a pointer in hexadecimal.
  Message& operator<<(const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%p", p);
    text_ += buf;
    return *this;
  }
  // The message so far.
  const std::string& str() const { return text_; }

 private:
  std::string text_;
};

}  // namespace tdist

// TDIST_CHECK(cond, rank, op, stream-expression): throws tdist::Error when cond is false.
#define TDIST_CHECK(cond, rank, op, what)                                         \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ::tdist::Message tdist_msg_;                                                \
      tdist_msg_ << ::tdist::error_prefix((rank), (op)) << what;                  \
      throw ::tdist::Error(tdist_msg_.str());                                     \
    }                                                                             \
  } while (0)

#define TDIST_FAIL(rank, op, what) TDIST_CHECK(false, rank, op, what)
