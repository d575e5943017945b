#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace redco {

enum class DeviceKind : uint8_t { cpu, cuda };
inline constexpr int kDeviceKinds = 2;

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceKind::cuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }
};

}  // namespace redco
