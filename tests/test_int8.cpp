// int8 as a storage dtype (quantized weights live in it): casts against values worked out by hand,
// including PyTorch's wrap-around for out-of-range values, then printing, promotion, checkpoints and
// the ops that refuse it.
#include <doctest/doctest.h>

#include "helpers.h"
#include "miniflow.h"

#include <cstdint>
#include <filesystem>
#include <vector>

using namespace mf;

TEST_CASE("casts to int8 truncate toward zero and wrap modulo 256, as PyTorch's CPU casts do") {
  // torch.tensor([2.9, -2.9, 127.0, 128.0, 300.0, -129.5, 0.5]).to(torch.int8) gives
  // [2, -2, 127, -128, 44, 127, 0]: truncation to an integer, then its low 8 bits (300 - 256 = 44;
  // -129 + 256 = 127).
  Tensor x = from_vector<float>({2.9f, -2.9f, 127.0f, 128.0f, 300.0f, -129.5f, 0.5f});
  CHECK(x.to(DType::Int8).to_vector<int64_t>() == std::vector<int64_t>{2, -2, 127, -128, 44, 127, 0});
  CHECK(x.to(DType::Float64).to(DType::Int8).to_vector<int64_t>() == std::vector<int64_t>{2, -2, 127, -128, 44, 127, 0});
  // Through bfloat16 (8 significant bits) 2.9 becomes 2.90625 and -129.5, halfway between -129 and
  // -130, the even -130: truncated and wrapped, 126.
  CHECK(x.to(DType::BFloat16).to(DType::Int8).to_vector<int64_t>() ==
        std::vector<int64_t>{2, -2, 127, -128, 44, 126, 0});
  CHECK(from_vector<int64_t>({200, -200, 256, -1}).to(DType::Int8).to_vector<int64_t>() ==
        std::vector<int64_t>{-56, 56, 0, -1});
  CHECK(from_vector<bool>({true, false}).to(DType::Int8).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
}

TEST_CASE("tensors hold int8: exact casts out, fills, views and printing") {
  Tensor q = from_vector<int8_t>({-128, -1, 0, 1, 127, 5}, {2, 3});
  CHECK(q.dtype() == DType::Int8);
  CHECK(q.element_size() == 1);
  CHECK(!is_floating(q.dtype()));
  CHECK(q.to(DType::Float32).to_vector<float>() == std::vector<float>{-128, -1, 0, 1, 127, 5});
  CHECK(q.to(DType::BFloat16).to(DType::Float32).to_vector<float>() == std::vector<float>{-128, -1, 0, 1, 127, 5});
  CHECK(q.to(DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{-128, -1, 0, 1, 127, 5});
  CHECK(q.to(DType::Bool).to_vector<bool>() == std::vector<bool>{true, true, false, true, true, true});
  CHECK(q.t().contiguous().to_vector<int64_t>() == std::vector<int64_t>{-128, 1, -1, 127, 0, 5});
  CHECK(q[1][1].item<int64_t>() == 127);
  CHECK(full({2}, -3, DType::Int8).to_vector<int64_t>() == std::vector<int64_t>{-3, -3});
  // Printed as numbers, not characters, with the dtype named as PyTorch names it.
  CHECK(to_string(from_vector<int8_t>({1, -56})) == "tensor([  1, -56], dtype=int8)");
  CHECK(promote_types(DType::Int8, DType::Int64) == DType::Int64);
  CHECK(promote_types(DType::Int8, DType::Bool) == DType::Int8);
  CHECK(promote_types(DType::Int8, DType::Float32) == DType::Float32);
  CHECK(promote_types(DType::Int8, DType::BFloat16) == DType::BFloat16);
}

TEST_CASE("ops that compute refuse int8, naming the op and the dtype") {
  Tensor q = ones({2, 2}, DType::Int8);
  CHECK_THROWS_WITH_AS(q.add(q), doctest::Contains("add: int8 tensors are stored, cast, copied, filled and viewed so far"),
                       Error);
  CHECK_THROWS_WITH_AS(q.matmul(q), doctest::Contains("cast with .to(mf::DType::Float32) first"), Error);
  CHECK_THROWS_WITH_AS(q.sum(), doctest::Contains("sum: int8"), Error);
  CHECK(q.view({4}).narrow(0, 1, 2).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
}

TEST_CASE("int8 tensors round-trip through safetensors as I8") {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "mf_int8_test.safetensors";
  Tensor q = from_vector<int8_t>({-128, 127, 0, -7, 3, 1}, {3, 2});
  nn::save_tensors(path.string(), {{"q", q}, {"scale", from_vector<float>({0.5f, 0.25f, 2.0f})}});
  nn::TensorFile file = nn::load_tensors(path.string());
  std::filesystem::remove(path);
  REQUIRE(file.tensors.size() == 2);
  const Tensor& loaded = file.tensors[0].name == "q" ? file.tensors[0].tensor : file.tensors[1].tensor;
  CHECK(loaded.dtype() == DType::Int8);
  CHECK(loaded.shape() == Shape{3, 2});
  CHECK(loaded.to_vector<int64_t>() == q.to_vector<int64_t>());
}
