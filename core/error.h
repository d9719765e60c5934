// The one exception type miniflow throws, and the checks that build its messages.
#pragma once

#include <fmt/format.h>

#include <source_location>
#include <stdexcept>
#include <string>

namespace mf {

/// Every error miniflow reports on bad input: the message names the op, the shapes, dtypes and
/// devices involved, and where it can, the user's call site ("... at model.cpp:42").
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// "model.cpp:42" for a call site (the file's base name keeps messages short).
std::string format_location(const std::source_location& loc);

/// Throws mf::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace mf

/// MF_CHECK(cond, "fmt", args...): throws mf::Error with the message when cond is false.
#define MF_CHECK(cond, ...)                  \
  do {                                       \
    if (!(cond)) [[unlikely]] {              \
      ::mf::fail(__VA_ARGS__);               \
    }                                        \
  } while (false)
