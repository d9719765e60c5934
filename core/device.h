// Where a tensor's memory lives.
#pragma once

#include <cstdint>
#include <string>

namespace mf {

enum class DeviceType : uint8_t { CPU, CUDA };
inline constexpr int kDeviceTypeCount = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int8_t index = 0;

  static constexpr Device cpu() { return {DeviceType::CPU, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::CUDA, static_cast<int8_t>(index)}; }

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  constexpr bool operator==(const Device&) const = default;

  /// "cpu" or "cuda:0".
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

  /// Parses "cpu", "cuda" or "cuda:N"; throws mf::Error on anything else.
  static Device parse(const std::string& text);
};

}  // namespace mf
