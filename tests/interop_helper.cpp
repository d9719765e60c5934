// The C++ side of tests/interop_safetensors.py, which holds miniflow's checkpoints against Python's
// safetensors package:
//   interop_helper write PATH   writes a fixed set of tensors (values the script recomputes with numpy)
//   interop_helper check PATH   loads the file the script wrote and checks every name, shape, dtype
//                               and value; exit status 0 when all match, 1 with the differences listed.
//   interop_helper write-bf16 PATH, check-bf16 PATH: the same for bfloat16 tensors, in files of their
//                               own (numpy, which the script reads the others with, has no bfloat16).
#include "miniflow.h"

#include <fmt/core.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using mf::DType;
using mf::Tensor;

// Written by miniflow, read by Python. Keep in step with MINIFLOW_WRITES in interop_safetensors.py.
mf::nn::StateDict written_tensors() {
  // [[0, 1, 2], [3, 4, 5]] as float32, transposed: a non-contiguous view.
  Tensor base = mf::arange(6, DType::Float32).view({2, 3});
  return {
      {"f32.matrix", mf::arange(6, DType::Float32).mul(0.5).sub(1.0).view({2, 3})},  // (i * 0.5) - 1
      {"f32.transposed", base.t()},
      {"f64.cube", mf::arange(24, DType::Float64).sub(12.0).mul(0.1).view({2, 3, 4})},  // (i - 12) * 0.1
      {"i64.extremes", mf::from_vector<int64_t>({0, -1, int64_t{1} << 40, std::numeric_limits<int64_t>::max(),
                                                 std::numeric_limits<int64_t>::min()})},
      {"bool.mask", mf::from_vector<bool>({true, false, false, true}, {2, 2})},
      {"i8.extremes", mf::from_vector<int8_t>({-128, -127, 0, 1, 127, -2}, {3, 2})},
      {"scalar", mf::scalar_tensor(3.25, DType::Float64)},
      {"empty", mf::zeros({0, 2})},
  };
}

// Written by Python, read by miniflow. Keep in step with PYTHON_WRITES in interop_safetensors.py.
mf::nn::StateDict expected_from_python() {
  std::vector<double> tenths;
  for (int i = -3; i < 3; ++i) tenths.push_back(i * 0.1);  // np.arange(-3, 3) * 0.1
  return {
      {"py.f32", mf::arange(12, DType::Float32).div(4.0).view({3, 4})},  // np.arange(12) / 4
      {"py.f64", mf::from_vector<double>(tenths, {6})},
      {"py.i64", mf::from_vector<int64_t>({7, -8, int64_t{1} << 62}, {3})},
      {"py.bool", mf::from_vector<bool>({true, false, true}, {1, 3})},
      {"py.i8", mf::from_vector<int8_t>({-100, 100, -1}, {3})},
      {"py.scalar", mf::scalar_tensor(-1.5, DType::Float32)},
      {"py.cube", mf::arange(8, DType::Float64).view({2, 2, 2})},
  };
}

// bfloat16, written by miniflow: float32 values cast with rounding to nearest, ties to even. Keep in
// step with MINIFLOW_WRITES_BF16 in interop_safetensors.py, which holds the bits worked out by hand.
mf::nn::StateDict written_bfloat16() {
  // 1 + 2^-8 and 1 + 3 * 2^-8 are ties (to the even neighbour); 0.1f rounds up.
  const std::vector<float> values = {1.0f, -2.5f, 0.1f, 1.00390625f, 1.01171875f,
                                     std::numeric_limits<float>::infinity(), -0.0f};
  return {{"bf16.rounded", mf::from_vector<float>(values).to(DType::BFloat16)}};
}

// bfloat16, written by Python from raw bits. Keep in step with PYTHON_WRITES_BF16 in interop_safetensors.py.
mf::nn::StateDict expected_bfloat16_from_python() {
  std::vector<mf::bfloat16> values;
  for (uint16_t bits : {0x4049, 0xBF80, 0x0001, 0xFF80, 0x7FC0}) values.push_back(mf::bfloat16::from_bits(bits));
  return {{"py.bf16", mf::from_vector<mf::bfloat16>(values, {1, 5})}};
}

// Differences between what was loaded and what was expected, one line each.
std::vector<std::string> compare(const mf::nn::TensorFile& file, const mf::nn::StateDict& expected) {
  std::vector<std::string> problems;
  if (file.tensors.size() != expected.size())
    problems.push_back(fmt::format("file has {} tensors, expected {}", file.tensors.size(), expected.size()));
  for (const mf::nn::NamedTensor& want : expected) {
    const Tensor* got = mf::nn::find(file.tensors, want.name);
    if (got == nullptr) {
      problems.push_back(fmt::format("{}: missing", want.name));
    } else if (got->dtype() != want.tensor.dtype() || got->shape() != want.tensor.shape()) {
      problems.push_back(fmt::format("{}: got {} {}, expected {} {}", want.name, mf::dtype_name(got->dtype()),
                                     mf::shape_str(got->shape()), mf::dtype_name(want.tensor.dtype()),
                                     mf::shape_str(want.tensor.shape())));
    } else if (mf::nn::to_record("", *got).data != mf::nn::to_record("", want.tensor).data) {  // bit for bit
      problems.push_back(fmt::format("{}: values differ: got {}, expected {}", want.name, *got, want.tensor));
    }
  }
  auto writer = file.metadata.find("writer");
  if (writer == file.metadata.end() || writer->second != "python")
    problems.push_back("metadata has no writer=python entry");
  return problems;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "write" && mode != "check" && mode != "write-bf16" && mode != "check-bf16") {
    fmt::print(stderr, "usage: interop_helper write|check|write-bf16|check-bf16 PATH\n");
    return 2;
  }
  try {
    if (mode.starts_with("write")) {
      mf::nn::save_tensors(argv[2], mode == "write" ? written_tensors() : written_bfloat16(), {{"writer", "miniflow"}});
      return 0;
    }
    const mf::nn::StateDict expected = mode == "check" ? expected_from_python() : expected_bfloat16_from_python();
    const std::vector<std::string> problems = compare(mf::nn::load_tensors(argv[2]), expected);
    for (const std::string& problem : problems) fmt::print("check: {}\n", problem);
    if (problems.empty()) fmt::print("check: {} tensors match\n", expected.size());
    return problems.empty() ? 0 : 1;
  } catch (const mf::Error& e) {
    fmt::print(stderr, "interop_helper {}: {}\n", mode, e.what());
    return 1;
  }
}
