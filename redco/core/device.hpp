#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace redco {

// cpu: host memory, read directly. cuda: a GPU. test: host memory that
// behaves like an accelerator's (its own allocator and backend; an op mixing
// it with another device, or a host read of its bytes outside an explicit
// copy, is an error), so that CI proves the device path without a GPU.
enum class DeviceKind : uint8_t { cpu, cuda, test };
inline constexpr int kDeviceKinds = 3;

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceKind::cuda, i}; }
  static constexpr Device test(int i = 0) { return {DeviceKind::test, i}; }
  // Only CPU memory may be read by the host outside an explicit copy.
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string str() const {
    if (is_cpu()) return "cpu";
    return fmt::format("{}:{}", kind == DeviceKind::cuda ? "cuda" : "test", index);
  }
};

}  // namespace redco
