#include "redco/core/device_memory.hpp"

#include <array>
#include <cstring>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/core/tensor.hpp"

namespace redco {
namespace {

// The test device's memory: host memory from its own caching pool. Its copy,
// fill and convert are the only code that touches the bytes from the host,
// as a GPU's copy engine and kernels would be.
class TestDeviceMemory final : public DeviceMemory {
 public:
  void* allocate(int, size_t bytes, size_t* capacity) override {
    return CachingAllocator::test_device().allocate(bytes, capacity);
  }
  void deallocate(int, void* p, size_t capacity) override {
    CachingAllocator::test_device().deallocate(p, capacity);
  }
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void fill(int, void* p, DType dt, int64_t n, float value) override {
    // Fill a host tensor over the same bytes: Tensor::fill knows every dtype.
    Tensor::borrow(p, Shape{n}, dt, nullptr).fill(value);
  }
  void convert(int, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) override {
    Tensor to = Tensor::borrow(dst, Shape{n}, dst_dt, nullptr);
    to.copy_from(Tensor::borrow(const_cast<void*>(src), Shape{n}, src_dt, nullptr));
  }
  AllocatorStats stats(int) const override { return CachingAllocator::test_device().stats(); }
  int device_count() const override { return 1; }
};

std::array<DeviceMemory*, kDeviceKinds>& registry() {
  static TestDeviceMemory test;
  static std::array<DeviceMemory*, kDeviceKinds> r{nullptr, nullptr, &test};
  return r;
}
}  // namespace

void register_device_memory(DeviceKind kind, DeviceMemory* mem) {
  REDCO_CHECK(kind != DeviceKind::cpu, "the cpu memory is built in and cannot be replaced");
  registry()[size_t(kind)] = mem;
}

bool has_device_memory(DeviceKind kind) { return registry()[size_t(kind)] != nullptr; }

DeviceMemory& device_memory(Device device) {
  DeviceMemory* m = registry()[size_t(device.kind)];
  REDCO_CHECK(m,
              "device {} has no allocator in this build (reconfigure redco with "
              "-Dcuda=enabled on a machine with the CUDA toolkit)",
              device.str());
  return *m;
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
  } else if (dst_dev.is_cpu() || src_dev.is_cpu() || dst_dev.kind == src_dev.kind) {
    device_memory(dst_dev.is_cpu() ? src_dev : dst_dev).copy(dst, dst_dev, src, src_dev, bytes);
  } else {
    // Two different accelerator kinds share no copy engine: stage on the host.
    std::vector<char> host(bytes);
    device_memory(src_dev).copy(host.data(), Device::cpu(), src, src_dev, bytes);
    device_memory(dst_dev).copy(dst, dst_dev, host.data(), Device::cpu(), bytes);
  }
}

}  // namespace redco
