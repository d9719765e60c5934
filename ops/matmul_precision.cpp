// set_float32_matmul_precision: which GEMM float32 products take (ops/cpu/blas.h asks on every call).
#include "core/error.h"
#include "ops/cpu/blas.h"
#include "ops/functional.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <string_view>

namespace mf {
namespace {

constexpr std::array<std::string_view, 3> kPrecisions = {"highest", "high", "medium"};
std::atomic<size_t> precision_index{0};
// Whether "medium" is set and this CPU runs the bfloat16 GEMM on its dot products: decided when the
// precision is set, so that each GEMM reads one flag.
std::atomic<bool> bfloat16_products{false};

}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  auto found = std::find(kPrecisions.begin(), kPrecisions.end(), precision);
  MF_CHECK(found != kPrecisions.end(),
           "set_float32_matmul_precision: expected \"highest\", \"high\" or \"medium\", got \"{}\"", precision);
  precision_index = static_cast<size_t>(found - kPrecisions.begin());
  bfloat16_products = precision == "medium" && cpu::gemm_bf16_uses_dot_products();
}

std::string get_float32_matmul_precision() { return std::string(kPrecisions[precision_index]); }

bool cpu::products_in_bfloat16() { return bfloat16_products.load(std::memory_order_relaxed); }

}  // namespace mf
