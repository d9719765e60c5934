#include "core/isa.h"

#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace mf {
namespace {

constexpr std::array kLevels = {Isa::avx512, Isa::avx2, Isa::baseline};  // widest first, as messages list them

constexpr const char* kVariable = "MINIFLOW_ISA";

Isa detect_cpu_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
#endif
  return Isa::baseline;
}

std::string_view requested_value() {
  const char* value = std::getenv(kVariable);
  return value ? value : "";
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::baseline: break;
  }
  return "baseline";
}

Isa cpu_isa() {
  static const Isa isa = detect_cpu_isa();
  return isa;
}

detail::IsaRequest detail::resolve_isa_request(std::string_view value, Isa cpu) {
  if (value.empty()) return {cpu, ""};
  for (Isa level : kLevels) {
    if (value != isa_name(level)) continue;
    if (level <= cpu) return {level, ""};
    return {cpu, fmt::format("{}={} asks for more than this CPU runs; using {}", kVariable, value, isa_name(cpu))};
  }
  return {cpu, fmt::format("{}='{}' is not one of avx512, avx2, baseline; using {}", kVariable, value,
                           isa_name(cpu))};
}

Isa kernel_isa() {
  static const Isa isa = [] {
    detail::IsaRequest request = detail::resolve_isa_request(requested_value(), cpu_isa());
    if (!request.warning.empty()) std::fprintf(stderr, "miniflow: warning: %s\n", request.warning.c_str());
    return request.isa;
  }();
  return isa;
}

std::string describe_kernel_isa() {
  std::string_view value = requested_value();
  if (kernel_isa() == cpu_isa() && value != isa_name(cpu_isa())) {
    if (cpu_isa() == Isa::baseline) return "kernels baseline (this CPU has neither AVX2 + FMA nor AVX-512)";
    std::string narrower;
    for (Isa level : kLevels)
      if (level < cpu_isa()) narrower += fmt::format("{}{}", narrower.empty() ? "" : "|", isa_name(level));
    return fmt::format("kernels {} (the widest this CPU runs; {}={} narrows it)", isa_name(kernel_isa()), kVariable,
                       narrower);
  }
  return fmt::format("kernels {} ({}={}; this CPU runs {})", isa_name(kernel_isa()), kVariable, value,
                     isa_name(cpu_isa()));
}

std::string_view why_no_bfloat16_dot_products() {
  if (!cpu_has_avx512_bf16()) return "this CPU lacks AVX512-BF16";
  if (kernel_isa() != Isa::avx512) return "MINIFLOW_ISA narrows the kernels below AVX512-BF16";
  if (!cpu_has_fast_avx512_bf16()) return "this CPU runs vdpbf16ps slower than its float32 FMA";
  return "";
}

// __builtin_cpu_supports takes only a literal name, so each feature asks for its own.
#if defined(__x86_64__) && defined(__GNUC__)
bool cpu_has_avx512_bf16() {
  static const bool has = cpu_isa() >= Isa::avx512 && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

bool cpu_has_fast_avx512_bf16() {
  static const bool fast = cpu_has_avx512_bf16() && __builtin_cpu_is("amd");
  return fast;
}

bool cpu_has_avx512_vnni() {
  static const bool has = cpu_isa() >= Isa::avx512 && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}
#else
bool cpu_has_avx512_bf16() { return false; }
bool cpu_has_fast_avx512_bf16() { return false; }
bool cpu_has_avx512_vnni() { return false; }
#endif

std::string detail::cpu_model_name_from(std::istream& cpuinfo) {
  // The first processor's block: "key<TAB>: value" lines, ended by an empty line.
  std::string line, name = "unknown CPU", family, model;
  while (std::getline(cpuinfo, line) && !line.empty()) {
    size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name") name = value;
    else if (key == "cpu family") family = value;
    else if (key == "model") model = value;
  }
  if (family.empty() || model.empty()) return name;
  return fmt::format("{} (family {}, model {})", name, family, model);
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  return detail::cpu_model_name_from(cpuinfo);
}

}  // namespace mf
