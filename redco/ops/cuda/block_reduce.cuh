#pragma once
// Block-wide sum / max for the row kernels (one block of kRowThreads per row).
#include <cmath>

namespace redco::cuda::k {

constexpr int kRowThreads = 256;

// Every thread of the block gets the result. `scratch` is kRowThreads/32
// floats of shared memory; the trailing barrier lets the caller reuse it.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kRowThreads / 32; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_sum(float v, float* s) { return block_reduce<false>(v, s); }
__device__ __forceinline__ float block_max(float v, float* s) { return block_reduce<true>(v, s); }

}  // namespace redco::cuda::k
