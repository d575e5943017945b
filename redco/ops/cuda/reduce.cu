// Reductions, argmax and the strided gather behind broadcast_to/permute.
//
// A reduction pass is [O, R, I] -> [O, I] (see ops/cpu/reduce.cpp for how the
// backend splits any axis set into such passes):
//   I == 1: one block per output row, threads stride the row and combine
//           through warp shuffles (a tree: the rounding error grows with
//           log R, not R);
//   I > 1:  one thread per output column, walking R with coalesced reads
//           across the warp; sums accumulate in double, like the CPU's
//           column sums. When R is long (a bias gradient: [1, B*T, d]),
//           that leaves the GPU nearly idle (768 threads for GPT-2's biases:
//           1.75 ms a call on an H200), so the 32 warps of a block split R
//           instead, each lane one column, and the block adds the warps'
//           double partials in warp order: the same result on every run.
#include <cfloat>

#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float combine(bool is_max, float a, float b) {
  return is_max ? (a < b ? b : a) : a + b;
}

__global__ void reduce_rows(bool is_max, const float* x, float* y, int64_t R) {
  const float* row = x + int64_t(blockIdx.x) * R;
  float acc = is_max ? -INFINITY : 0.f;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) acc = combine(is_max, acc, row[r]);
  for (int off = 16; off > 0; off >>= 1)
    acc = combine(is_max, acc, __shfl_down_sync(0xffffffffu, acc, off));
  __shared__ float warp[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = warp[0];
    for (int w = 1; w < kThreads / 32; ++w) total = combine(is_max, total, warp[w]);
    y[blockIdx.x] = total;
  }
}

__global__ void reduce_cols(bool is_max, const float* x, float* y, int64_t O, int64_t R,
                            int64_t I) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= O * I) return;
  const int64_t o = t / I, i = t % I;
  const float* p = x + o * R * I + i;
  if (is_max) {
    float m = -INFINITY;
    for (int64_t r = 0; r < R; ++r) m = m < p[r * I] ? p[r * I] : m;
    y[t] = m;
  } else {
    double s = 0;
    for (int64_t r = 0; r < R; ++r) s += p[r * I];
    y[t] = float(s);
  }
}

constexpr int kSplitWarps = 32;

__global__ void reduce_cols_split(bool is_max, const float* x, float* y, int64_t O, int64_t R,
                                  int64_t I) {
  __shared__ double part[kSplitWarps][33];  // 33: no bank conflicts on the column reads
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t t = int64_t(blockIdx.x) * 32 + lane;
  double acc = is_max ? -INFINITY : 0.0;
  if (t < O * I) {
    const float* p = x + (t / I) * R * I + t % I;
    for (int64_t r = warp; r < R; r += kSplitWarps) {
      const double v = p[r * I];
      acc = is_max ? (acc < v ? v : acc) : acc + v;
    }
  }
  part[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && t < O * I) {
    double total = part[0][lane];
    for (int w = 1; w < kSplitWarps; ++w)
      total = is_max ? (total < part[w][lane] ? part[w][lane] : total) : total + part[w][lane];
    y[t] = float(total);
  }
}

// Strict '>' keeps the first index among equal maxima, as on the CPU.
__global__ void argmax_kernel(const float* x, int64_t* y, int64_t O, int64_t R, int64_t I) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= O * I) return;
  const int64_t o = t / I, i = t % I;
  const float* p = x + o * R * I + i;
  float best = p[0];
  int64_t at = 0;
  for (int64_t r = 1; r < R; ++r) {
    if (p[r * I] > best) {
      best = p[r * I];
      at = r;
    }
  }
  y[t] = at;
}

template <typename T>
__global__ void gather_kernel(const T* in, T* out, Strided s, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i, off = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      off += (rest % s.dims[d]) * s.a[d];
      rest /= s.dims[d];
    }
    out[i] = in[off];
  }
}

unsigned blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 64 ? b : 65535 * 64);
}

}  // namespace

void reduce_pass(bool is_max, const float* x, float* y, int64_t O, int64_t R, int64_t I) {
  if (O == 0 || I == 0) return;
  if (I == 1) {
    // gridDim.x allows 2^31 - 1 rows, far beyond any row count in practice.
    reduce_rows<<<unsigned(O), kThreads, 0, stream()>>>(is_max, x, y, R);
  } else if (R >= 4 * kSplitWarps) {
    reduce_cols_split<<<unsigned((O * I + 31) / 32), 32 * kSplitWarps, 0, stream()>>>(is_max, x, y,
                                                                                      O, R, I);
  } else {
    reduce_cols<<<unsigned((O * I + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(is_max, x,
                                                                                        y, O, R, I);
  }
  check_launch("reduce");
}

void argmax(const float* x, int64_t* y, int64_t O, int64_t R, int64_t I) {
  if (O * I == 0) return;
  argmax_kernel<<<unsigned((O * I + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(x, y, O, R,
                                                                                        I);
  check_launch("argmax");
}

void gather(const void* in, void* out, int elem_size, const Strided& s, int64_t n) {
  if (n == 0) return;
  const unsigned g = blocks(n);
  switch (elem_size) {
    case 1:
      gather_kernel<<<g, kThreads, 0, stream()>>>(static_cast<const uint8_t*>(in),
                                                  static_cast<uint8_t*>(out), s, n);
      break;
    case 2:
      gather_kernel<<<g, kThreads, 0, stream()>>>(static_cast<const uint16_t*>(in),
                                                  static_cast<uint16_t*>(out), s, n);
      break;
    case 4:
      gather_kernel<<<g, kThreads, 0, stream()>>>(static_cast<const uint32_t*>(in),
                                                  static_cast<uint32_t*>(out), s, n);
      break;
    default:
      gather_kernel<<<g, kThreads, 0, stream()>>>(static_cast<const uint64_t*>(in),
                                                  static_cast<uint64_t*>(out), s, n);
      break;
  }
  check_launch("gather");
}

}  // namespace redco::cuda::k
