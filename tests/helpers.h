// Shared test helpers.
#pragma once

#include <doctest/doctest.h>

#include "miniflow.h"

#include <cmath>
#include <string>
#include <vector>

namespace mf::testing {

/// Shape, dtype and every value of `actual` against `expected` (|a - e| <= atol + rtol |e|; exact for
/// integer and bool tensors; NaNs must match NaNs), on whatever devices they are.
inline void check_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  REQUIRE(actual.defined());
  REQUIRE(expected.defined());
  REQUIRE(shape_str(actual.shape()) == shape_str(expected.shape()));
  REQUIRE(dtype_name(actual.dtype()) == dtype_name(expected.dtype()));
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  bool exact = !is_floating(expected.dtype());
  for (size_t i = 0; i < a.size(); ++i) {
    bool ok = exact ? a[i] == e[i]
                    : (std::isnan(e[i]) ? std::isnan(a[i]) : std::abs(a[i] - e[i]) <= atol + rtol * std::abs(e[i]));
    if (!ok) {
      FAIL_CHECK("element " << i << ": got " << a[i] << ", expected " << e[i]);
      return;
    }
  }
}

/// The devices a test written once runs on: the CPU, and the first GPU where one is present. Without a
/// GPU the first call says, once per test binary, that CUDA was skipped and why; tests take their
/// inputs from the host and move them: `for (Device device : test_devices()) { CAPTURE(device); ...}`.
inline const std::vector<Device>& test_devices() {
  static const std::vector<Device> devices = [] {
    std::vector<Device> found{Device::cpu()};
    if (cuda::is_available()) {
      found.push_back(Device::cuda(0));
    } else {
      MESSAGE(("SKIPPED device cuda: " + cuda::unavailable_reason()));
    }
    return found;
  }();
  return devices;
}

/// Restores the thread count a test found, however the test ends.
struct ThreadCountGuard {
  int saved = get_num_threads();
  ~ThreadCountGuard() { set_num_threads(saved); }
};

/// The words of `text` as spaces separate them (runs of spaces and tabs), as a reader splits text.
inline std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text + ' ') {
    if (c != ' ' && c != '\t') {
      word += c;
    } else if (!word.empty()) {
      words.push_back(word);
      word.clear();
    }
  }
  return words;
}

/// A float64 tensor from values, for hand-worked expectations.
inline Tensor f64(const std::vector<double>& values, const Shape& shape = {}) {
  return from_vector(values, shape);
}

}  // namespace mf::testing

/// CAPTURE(device) prints "cpu" or "cuda:0".
template <>
struct doctest::StringMaker<mf::Device> {
  static doctest::String convert(const mf::Device& device) { return device.str().c_str(); }
};
