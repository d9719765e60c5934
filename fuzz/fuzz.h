// What the fuzz targets count as a finding. Bad input must fail with mf::Error; any other
// exception (std::bad_alloc, nlohmann::json's, std::out_of_range, ...) means a check is missing, and
// a broken promise of the parser (fuzz::require) is a bug too. Both abort, so libFuzzer saves the
// input as a crash. Crashes, sanitizer reports, hangs and huge allocations libFuzzer finds itself.
#pragma once

#include "core/error.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string_view>
#include <typeinfo>

namespace mf::fuzz {

/// Runs `parse`, accepting mf::Error as the outcome of bad input; aborts on any other exception.
template <typename Parse>
void expect_only_mf_errors(Parse&& parse) {
  try {
    parse();
  } catch (const Error&) {
    // the expected way to refuse an input
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: %s escaped instead of mf::Error: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
}

/// Aborts when a promise the parser makes about its result does not hold.
inline void require(bool ok, const char* promise) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: broken promise: %s\n", promise);
  std::abort();
}

/// libFuzzer's input as bytes and as text.
inline std::span<const std::byte> as_bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace mf::fuzz
