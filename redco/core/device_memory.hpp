#pragma once
// The seam between Tensor and accelerator memory. Tensor knows only the CPU
// caching allocator; a device backend (redco/ops/cuda) registers a
// DeviceMemory for its DeviceKind when it is linked in, and Tensor::empty,
// zeros, clone, fill, copy_from and to(Device) route non-CPU storage through
// it. A build without CUDA registers nothing, and every such call fails with
// an error that names the device.
#include <cstddef>
#include <cstdint>

#include "redco/core/allocator.hpp"
#include "redco/core/device.hpp"
#include "redco/core/dtype.hpp"

namespace redco {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // A block of at least `bytes` on `device`; *capacity receives the rounded
  // size, which is passed back to deallocate.
  virtual void* allocate(int device, size_t bytes, size_t* capacity) = 0;
  virtual void deallocate(int device, void* p, size_t capacity) = 0;
  // Copies `bytes` between any two of {host, a device of this kind}. Returns
  // once `dst` may be read by the host when it is host memory; device-side
  // copies are ordered on the device's stream.
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) = 0;
  // n elements of dtype `dt` at p (device memory) set to `value`.
  virtual void fill(int device, void* p, DType dt, int64_t n, float value) = 0;
  // Elementwise dtype conversion between two device buffers of n elements.
  virtual void convert(int device, void* dst, DType dst_dt, const void* src, DType src_dt,
                       int64_t n) = 0;
  virtual AllocatorStats stats(int device) const = 0;
  // Devices of this kind present (a CUDA build on a machine without a GPU: 0).
  virtual int device_count() const = 0;
};

// Registers `mem` as the memory of every device of `kind` (not cpu).
void register_device_memory(DeviceKind kind, DeviceMemory* mem);
// The registered memory of `kind`; throws naming `device` when none is.
DeviceMemory& device_memory(Device device);
bool has_device_memory(DeviceKind kind);

// Byte copy between any two devices (either may be the CPU); a copy between
// two accelerator kinds goes through the host.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

}  // namespace redco
