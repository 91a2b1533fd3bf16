// Error types of dtrain (STYLE "Errors"): every failure the library reports is one of these, with a message
// that says what is wrong, the value, the constraint and the likely fix.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dtrain {

// Base of all dtrain errors. libtorch's own c10::Error is never wrapped in it.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad input: the caller must change something (a config value, a placement, a shape).
class ValueError : public Error {
 public:
  using Error::Error;
};

// A valid request that this build or backend cannot serve.
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

// A peer or a transport failed during communication.
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective or another blocking call did not finish in time.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// Concatenates anything streamable into one string: str_cat("dp(", 2, ")").
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace dtrain

// An internal invariant; never compiled out. Names the file and line; the optional message gives the values.
#define DTRAIN_ASSERT(cond, ...)                                                                   \
  do {                                                                                             \
    if (!(cond)) ::dtrain::assert_fail(#cond, __FILE__, __LINE__, ::dtrain::str_cat(__VA_ARGS__)); \
  } while (0)
