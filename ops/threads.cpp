#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/blas.h"
#include "ops/functional.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <string_view>

namespace mf {

// OpenBLAS itself stays single-threaded (ops/matmul.cpp): the pool splits GEMMs across threads.
void set_num_threads(int n) { set_intra_op_threads(n); }

int get_num_threads() { return intra_op_threads(); }

namespace {

constexpr std::array<std::string_view, 3> kPrecisions = {"highest", "high", "medium"};
std::atomic<size_t> precision_index{0};

}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  auto found = std::find(kPrecisions.begin(), kPrecisions.end(), precision);
  MF_CHECK(found != kPrecisions.end(),
           "set_float32_matmul_precision: expected \"highest\", \"high\" or \"medium\", got \"{}\"", precision);
  precision_index = static_cast<size_t>(found - kPrecisions.begin());
}

std::string get_float32_matmul_precision() { return std::string(kPrecisions[precision_index]); }

bool cpu::products_in_bfloat16() {
  return kPrecisions[precision_index.load(std::memory_order_relaxed)] == "medium" && gemm_bf16_uses_dot_products();
}

}  // namespace mf
