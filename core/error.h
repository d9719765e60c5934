// The one exception type miniflow throws, and the checks that build its messages.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace mf {

/// Every error miniflow reports on bad input: the message names the op, the shapes, dtypes and
/// devices involved, and where it can, the user's call site ("... at model.cpp:42").
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// "model.cpp:42" for a call site (the file's base name keeps messages short).
std::string format_location(const std::source_location& loc);

/// The system's text for an errno value ("No such file or directory"), for messages about files.
std::string errno_text(int err);

/// `value` as a person should read it: a NaN loses its sign bit, which fmt would print as "-nan" (whether
/// a NaN comes out signed depends on the kernel that made it); Python and PyTorch print every NaN as
/// "nan". Other values pass through.
template <typename T>
T readable(T value) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(value) ? std::fabs(value) : value;
  else
    return value;
}

namespace detail {
/// A floating-point argument by value through readable(); any other by reference.
template <typename T>
decltype(auto) readable_argument(const T& value) {
  if constexpr (std::is_floating_point_v<T>)
    return readable(value);
  else
    return (value);
}

template <typename... Args>
std::string vformat_readable(fmt::string_view format, const Args&... args) {
  auto with_values = [&](const auto&... values) { return fmt::vformat(format, fmt::make_format_args(values...)); };
  return with_values(readable_argument(args)...);
}
}  // namespace detail

/// fmt::format for messages a person reads (errors, logs, progress): floating-point arguments go through
/// readable(), so non-finite values print as nan, inf or -inf whatever the sign bit of a NaN.
template <typename... Args>
std::string format_message(fmt::format_string<Args...> format, Args&&... args) {
  return detail::vformat_readable(fmt::string_view(format), args...);
}

/// Throws mf::Error with a message formatted by format_message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(detail::vformat_readable(fmt::string_view(format), args...));
}

}  // namespace mf

/// MF_CHECK(cond, "fmt", args...): throws mf::Error with the message when cond is false.
#define MF_CHECK(cond, ...)                  \
  do {                                       \
    if (!(cond)) [[unlikely]] {              \
      ::mf::fail(__VA_ARGS__);               \
    }                                        \
  } while (false)
