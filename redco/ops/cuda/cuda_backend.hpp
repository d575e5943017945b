#pragma once
// The CUDA backend's public knobs. Only present in builds with CUDA
// (`redco_has_cuda` in Meson, REDCO_HAS_CUDA in C++); the backend and the
// device memory register themselves when the library is linked, after which
// Tensor::empty(shape, dtype, Device::cuda()) and every kernel on such
// tensors run on the GPU.
#include "redco/core/allocator.hpp"

namespace redco::cuda {

// Number of visible CUDA devices (0 without a GPU or a driver).
int device_count();
// Blocks until all work queued on `device`'s stream has finished.
void synchronize(int device = 0);
// Caching-allocator statistics for `device` (same meaning as the CPU one:
// system_allocs counts cudaMalloc calls; it stops growing after a first step).
AllocatorStats memory_stats(int device = 0);
// Returns every cached block of `device` to the driver (cudaFree).
void empty_cache(int device = 0);
// fp32 matmuls may use TF32 tensor cores (10-bit mantissa inputs, fp32
// accumulation): ~2-4x faster, ~1e-3 relative error. Off by default, so that
// matmul matches the CPU backend's fp32 result.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace redco::cuda
