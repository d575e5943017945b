// Elementwise CUDA kernels: unary maps, binary ops with numpy broadcasting,
// dtype conversion and fill, the pointwise activations and the dropout mask.
// The math mirrors redco/ops/cpu (f32 everywhere); the transcendental
// functions are CUDA's correctly-rounded-to-a-few-ulp versions, so results
// agree with the CPU backend to a few ulp, not bitwise.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "redco/core/philox.hpp"
#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 64 ? b : 65535 * 64);  // grid-stride loops cover the rest
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Op codes: the order of redco::UnaryOp (checked in backend_cuda.cpp).
__device__ __forceinline__ float unary_fn(int op, float x) {
  switch (op) {
    case 0:
      return -x;
    case 1:
      return expf(x);
    case 2:
      return logf(x);
    case 3:
      return tanhf(x);
    case 4:
      return sqrtf(x);
    case 5:
      return rsqrtf(x);
    case 6:
      return 1.f / (1.f + expf(-x));
    case 7:
      return x > 0.f ? x : 0.f;  // max(x, 0): NaN -> 0 like Eigen's max
    case 8:
      return erff(x);
    case 9:
      return fabsf(x);
    case 10:
      return x * x;
    case 11:
      return 1.f / x;
    default:
      return x > 0.f ? 1.f : 0.f;  // step
  }
}

// Op codes: the order of redco::BinaryOp.
__device__ __forceinline__ float binary_fn(int op, float a, float b) {
  switch (op) {
    case 0:
      return a + b;
    case 1:
      return a - b;
    case 2:
      return a * b;
    case 3:
      return a / b;
    case 4:
      return a < b ? b : a;
    case 5:
      return b < a ? b : a;
    case 6:
      return powf(a, b);
    case 7:
      return a == b ? 1.f : 0.f;
    default:
      return a > b ? 1.f : 0.f;
  }
}

__global__ void unary_kernel(int op, const float* x, float* y, int64_t n) {
  GRID_STRIDE(i, n) y[i] = unary_fn(op, x[i]);
}

__global__ void binary_flat(int op, const float* a, const float* b, float* y, int64_t n) {
  GRID_STRIDE(i, n) y[i] = binary_fn(op, a[i], b[i]);
}

__global__ void binary_strided(int op, const float* a, const float* b, float* y, int64_t n,
                               Strided s) {
  GRID_STRIDE(i, n) {
    int64_t rest = i, oa = 0, ob = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      const int64_t idx = rest % s.dims[d];
      rest /= s.dims[d];
      oa += idx * s.a[d];
      ob += idx * s.b[d];
    }
    y[i] = binary_fn(op, a[oa], b[ob]);
  }
}

__global__ void scalar_kernel(int op, const float* a, float s, float* y, int64_t n) {
  GRID_STRIDE(i, n) y[i] = binary_fn(op, a[i], s);
}

__global__ void add_kernel(float* a, const float* b, int64_t n) { GRID_STRIDE(i, n) a[i] += b[i]; }

__device__ __forceinline__ float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::i32:
      return float(static_cast<const int32_t*>(p)[i]);
    case DType::i64:
      return float(static_cast<const int64_t*>(p)[i]);
    default:
      return float(static_cast<const uint8_t*>(p)[i]);
  }
}

// The same conversions as Tensor::copy_from on the CPU (round to nearest
// even for bf16/f16, C++ truncation for the integers).
__device__ __forceinline__ void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::bf16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case DType::f16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = int32_t(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = int64_t(v);
      break;
    default:
      static_cast<uint8_t*>(p)[i] = uint8_t(int32_t(v));  // wraps, as the CPU does
      break;
  }
}

__global__ void convert_kernel(void* dst, DType dd, const void* src, DType sd, int64_t n) {
  GRID_STRIDE(i, n) store(dst, dd, i, load(src, sd, i));
}

__global__ void fill_kernel(void* p, DType dt, int64_t n, float v) {
  GRID_STRIDE(i, n) store(p, dt, i, v);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// The same formulations as ops/cpu/activation.cpp (see the reasons there:
// no cancellation for x < 0, finite limits when exp overflows).
__global__ void gelu_fwd(const float* x, float* y, int64_t n, bool tanh_approx) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = tanh_approx ? v / (1.f + expf(-2.f * kSqrt2OverPi * (v + kGeluCubic * v * v * v)))
                       : 0.5f * v * (1.f + erff(v * kInvSqrt2));
  }
}

__global__ void gelu_bwd(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    if (!tanh_approx) {
      dx[i] = dy[i] * (0.5f * (1.f + erff(v * kInvSqrt2)) + v * kInvSqrt2Pi * expf(-0.5f * v * v));
      continue;
    }
    const float e = expf(fminf(-2.f * kSqrt2OverPi * (v + kGeluCubic * v * v * v), 80.f));
    const float s = 1.f / (1.f + e);
    dx[i] = dy[i] * (s + 2.f * v * (s * s * e) * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * v * v));
  }
}

__global__ void silu_fwd(const float* x, float* y, int64_t n) {
  GRID_STRIDE(i, n) y[i] = x[i] / (1.f + expf(-x[i]));
}

__global__ void silu_bwd(const float* x, const float* dy, float* dx, int64_t n) {
  GRID_STRIDE(i, n) {
    const float s = 1.f / (1.f + expf(-x[i]));
    dx[i] = dy[i] * s * (1.f + x[i] * (1.f - s));
  }
}

// Element i keeps with probability keep_p, from the same Philox draw as
// philox_bernoulli on the CPU: bit-identical masks for the same (seed, stream).
__global__ void dropout_kernel(float* m, int64_t n, float keep_p, float scale, uint64_t seed,
                               uint64_t stream) {
  GRID_STRIDE(i, n) {
    const uint32_t bits = philox_bits(seed, stream, uint64_t(i));
    m[i] = float(bits >> 8) * 0x1p-24f < keep_p ? scale : 0.f;
  }
}

}  // namespace

void unary(int op, const float* x, float* y, int64_t n) {
  if (n == 0) return;
  unary_kernel<<<grid_for(n), kThreads, 0, stream()>>>(op, x, y, n);
  check_launch("unary");
}

void binary(int op, const float* a, const float* b, float* y, int64_t n, const Strided& s) {
  if (n == 0) return;
  if (s.rank == 0)
    binary_flat<<<grid_for(n), kThreads, 0, stream()>>>(op, a, b, y, n);
  else
    binary_strided<<<grid_for(n), kThreads, 0, stream()>>>(op, a, b, y, n, s);
  check_launch("binary");
}

void binary_scalar(int op, const float* a, float s, float* y, int64_t n) {
  if (n == 0) return;
  scalar_kernel<<<grid_for(n), kThreads, 0, stream()>>>(op, a, s, y, n);
  check_launch("binary_scalar");
}

void add_inplace(float* a, const float* b, int64_t n) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream()>>>(a, b, n);
  check_launch("add_inplace");
}

void fill(void* p, DType dt, int64_t n, float v) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream()>>>(p, dt, n, v);
  check_launch("fill");
}

void convert(void* dst, DType dd, const void* src, DType sd, int64_t n) {
  if (n == 0) return;
  convert_kernel<<<grid_for(n), kThreads, 0, stream()>>>(dst, dd, src, sd, n);
  check_launch("convert");
}

void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx) {
  if (n == 0) return;
  gelu_fwd<<<grid_for(n), kThreads, 0, stream()>>>(x, y, n, tanh_approx);
  check_launch("gelu");
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx) {
  if (n == 0) return;
  gelu_bwd<<<grid_for(n), kThreads, 0, stream()>>>(x, dy, dx, n, tanh_approx);
  check_launch("gelu backward");
}

void silu_forward(const float* x, float* y, int64_t n) {
  if (n == 0) return;
  silu_fwd<<<grid_for(n), kThreads, 0, stream()>>>(x, y, n);
  check_launch("silu");
}

void silu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  if (n == 0) return;
  silu_bwd<<<grid_for(n), kThreads, 0, stream()>>>(x, dy, dx, n);
  check_launch("silu backward");
}

void dropout_mask(float* m, int64_t n, float p, uint64_t seed, uint64_t stream_id) {
  if (n == 0) return;
  const float keep = 1.f - p;
  dropout_kernel<<<grid_for(n), kThreads, 0, stream()>>>(m, n, keep, 1.f / keep, seed, stream_id);
  check_launch("dropout_mask");
}

}  // namespace redco::cuda::k
