// How float32 products may compute: set_float32_matmul_precision, a process-wide setting that
// ops/cpu/blas.h asks on every GEMM, and autocast, per thread, which the dispatcher asks on every op.
#include "core/error.h"
#include "ops/cpu/blas.h"
#include "ops/functional.h"
#include "ops/kernel_api.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <string_view>

namespace mf {
namespace {

constexpr std::array<std::string_view, 3> kPrecisions = {"highest", "high", "medium"};  // MatmulPrecision's order
std::atomic<size_t> precision_index{0};
// Whether "medium" is set and this CPU runs the bfloat16 GEMM on its dot products: decided when the
// precision is set, so that each GEMM reads one flag.
std::atomic<bool> bfloat16_products{false};

thread_local std::array<bool, kDeviceTypeCount> autocast_on{};  // per device type, this thread

}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  auto found = std::find(kPrecisions.begin(), kPrecisions.end(), precision);
  MF_CHECK(found != kPrecisions.end(),
           "set_float32_matmul_precision: expected \"highest\", \"high\" or \"medium\", got \"{}\"", precision);
  precision_index = static_cast<size_t>(found - kPrecisions.begin());
  bfloat16_products = precision == "medium" && cpu::gemm_bf16_uses_dot_products();
}

std::string get_float32_matmul_precision() { return std::string(kPrecisions[precision_index]); }

detail::MatmulPrecision detail::float32_matmul_precision() {
  return static_cast<MatmulPrecision>(precision_index.load(std::memory_order_relaxed));
}

bool cpu::products_in_bfloat16() { return bfloat16_products.load(std::memory_order_relaxed); }

AutocastGuard::AutocastGuard(DeviceType device, DType dtype, bool enabled)
    : device_(device), previous_(autocast_on[static_cast<size_t>(device)]) {
  MF_CHECK(dtype == DType::BFloat16, "AutocastGuard: autocast lowers to bfloat16, got {}", dtype_name(dtype));
  autocast_on[static_cast<size_t>(device)] = enabled;
}

AutocastGuard::~AutocastGuard() { autocast_on[static_cast<size_t>(device_)] = previous_; }

bool is_autocast_enabled(DeviceType device) { return autocast_on[static_cast<size_t>(device)]; }

}  // namespace mf
