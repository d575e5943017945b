// Embedding gather / deterministic scatter-add, id validation, and rotary.
//
// embedding_backward sorts (id, position) pairs with CUB's stable radix sort,
// so each run of equal ids lists its positions in increasing order; one block
// owns each run and adds its rows in that order. Every dtable element thus
// receives its terms in the order of the CPU's serial loop: the result is
// bitwise identical to the CPU backend's, and needs no atomics.
#include <cub/device/device_radix_sort.cuh>

#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

constexpr int kThreads = 256;

__global__ void embed_fwd(const float* table, const int64_t* ids, float* out, int64_t n,
                          int64_t D) {
  const int64_t total = n * D;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x)
    out[t] = table[ids[t / D] * D + t % D];
}

__global__ void iota(int64_t* p, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i;
}

__global__ void embed_bwd(const float* dout, const int64_t* keys, const int64_t* pos, float* dtable,
                          int64_t n, int64_t D) {
  const int64_t k = blockIdx.x;
  if (k > 0 && keys[k] == keys[k - 1]) return;  // not the start of a run
  const int64_t id = keys[k];
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int64_t q = k; q < n && keys[q] == id; ++q) acc += dout[pos[q] * D + d];
    dtable[id * D + d] += acc;  // onto zeros, or onto a gradient summed so far
  }
}

__device__ unsigned long long g_first_bad;

__global__ void find_bad(const int64_t* ids, int64_t n, int64_t V, int64_t skip) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && ids[i] != skip && (ids[i] < 0 || ids[i] >= V))
    atomicMin(&g_first_bad, static_cast<unsigned long long>(i));
}

__global__ void rotary_table(float* cos_t, float* sin_t, int64_t T, int64_t D, int64_t pos_offset,
                             double base, double sign) {
  const int64_t half = D / 2, t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T * half) return;
  // In double, like the CPU: p * theta in float loses the angle's fraction
  // at long positions.
  const int64_t i = t % half;
  const double a = double(pos_offset + t / half) * pow(base, -2.0 * double(i) / double(D));
  cos_t[t] = float(cos(a));
  sin_t[t] = float(sign * sin(a));
}

__global__ void rotary_apply(const float* x, float* y, const float* cos_t, const float* sin_t,
                             int64_t rows, int64_t T, int64_t D) {
  const int64_t half = D / 2, total = rows * half;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = t / half, i = t % half, ti = (row % T) * half + i;
    const float x1 = x[row * D + i], x2 = x[row * D + i + half];
    y[row * D + i] = x1 * cos_t[ti] - x2 * sin_t[ti];
    y[row * D + i + half] = x2 * cos_t[ti] + x1 * sin_t[ti];
  }
}

unsigned blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 64 ? b : 65535 * 64);
}

size_t sort_temp_bytes(int64_t n) {
  size_t bytes = 0;
  REDCO_CUDA(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n));
  return bytes;
}

}  // namespace

void embedding_forward(const float* table, const int64_t* ids, float* out, int64_t n, int64_t D) {
  if (n * D == 0) return;
  embed_fwd<<<blocks(n * D), kThreads, 0, stream()>>>(table, ids, out, n, D);
  check_launch("embedding");
}

size_t embedding_backward_scratch(int64_t n) {
  return 3 * size_t(n) * sizeof(int64_t) + sort_temp_bytes(n);
}

void embedding_backward(const float* dout, const int64_t* ids, float* dtable, int64_t n, int64_t V,
                        int64_t D, void* scratch, size_t scratch_bytes) {
  if (n == 0 || D == 0) return;
  auto* keys = static_cast<int64_t*>(scratch);
  int64_t* pos_in = keys + n;
  int64_t* pos = pos_in + n;
  size_t temp = scratch_bytes - 3 * size_t(n) * sizeof(int64_t);
  iota<<<blocks(n), kThreads, 0, stream()>>>(pos_in, n);
  int end_bit = 1;  // ids are in [0, V): sort only the bits V needs
  while (end_bit < 63 && (int64_t(1) << end_bit) < V) ++end_bit;
  REDCO_CUDA(cub::DeviceRadixSort::SortPairs(pos + n, temp, ids, keys, pos_in, pos, n, 0, end_bit,
                                             stream()));
  embed_bwd<<<unsigned(n), 128, 0, stream()>>>(dout, keys, pos, dtable, n, D);
  check_launch("embedding backward");
}

int64_t first_bad_id(const int64_t* ids, int64_t n, int64_t V, int64_t skip) {
  if (n == 0) return -1;
  const unsigned long long none = ~0ull;
  REDCO_CUDA(cudaMemcpyToSymbolAsync(g_first_bad, &none, sizeof(none), 0, cudaMemcpyHostToDevice,
                                     stream()));
  find_bad<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(ids, n, V, skip);
  check_launch("id check");
  unsigned long long first = none;
  REDCO_CUDA(cudaMemcpyFromSymbolAsync(&first, g_first_bad, sizeof(first), 0,
                                       cudaMemcpyDeviceToHost, stream()));
  REDCO_CUDA(cudaStreamSynchronize(stream()));
  return first == none ? -1 : int64_t(first);
}

void rotary(const float* x, float* y, float* table, int64_t rows, int64_t T, int64_t D,
            int64_t pos_offset, float base, bool inverse) {
  const int64_t half = D / 2;
  if (rows == 0 || half == 0) return;
  float* cos_t = table;
  float* sin_t = table + T * half;
  rotary_table<<<unsigned((T * half + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(
      cos_t, sin_t, T, D, pos_offset, double(base), inverse ? -1.0 : 1.0);
  rotary_apply<<<blocks(rows * half), kThreads, 0, stream()>>>(x, y, cos_t, sin_t, rows, T, D);
  check_launch("rotary");
}

}  // namespace redco::cuda::k
