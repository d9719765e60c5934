#include "core/error.h"

#include "core/device.h"
#include "core/dtype.h"

#include <string_view>
#include <system_error>

namespace mf {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string format_location(const std::source_location& loc) {
  std::string_view file = loc.file_name();
  if (size_t slash = file.find_last_of('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  return fmt::format("{}:{}", file, loc.line());
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view digits = std::string_view(text).substr(5);
    if (!digits.empty() && digits.size() <= 2 && digits.find_first_not_of("0123456789") == std::string_view::npos)
      return cuda(std::stoi(std::string(digits)));
  }
  fail("unknown device '{}' (expected cpu, cuda or cuda:N)", text);
}

void detail::fail_not_computed(DType dtype) {
  fail("{} is a storage type so far: this computes in float32, float64, int64 or bool only (cast with "
       ".to(mf::DType::Float32) first)", dtype_name(dtype));
}

}  // namespace mf
