// Batched matmul on cuBLAS: op(a)[..., M, K] x op(b)[..., K, N] with numpy
// broadcasting of the batch dims, the same shapes and fast paths as
// ops/cpu/matmul.cpp.
//
// cuBLAS is column-major: a row-major C[M, N] is the column-major C^T, and
// C^T = op(B)^T op(A)^T, so every call passes B first with the dims swapped;
// the transposes stay GEMM flags. Compute is fp32 (CUBLAS_COMPUTE_32F, the
// CPU's result up to summation order) unless cuda::set_allow_tf32(true).
// Two bf16 (or two f16) operands go to the GEMM as they are: their products
// are exact in fp32 and accumulate in fp32, which is what converting them to
// f32 first would compute, without the conversion pass. Under
// Precision::bf16 f32 operands are rounded to bf16 first (gemm_operands).
#include <array>
#include <atomic>
#include <mutex>
#include <utility>

#include "redco/core/error.hpp"
#include "redco/ops/cuda/backend_cuda.hpp"
#include "redco/ops/cuda/cublas_api.hpp"
#include "redco/ops/cuda/cuda_backend.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/gemm.hpp"
#include "redco/ops/cuda/tensor_util.hpp"
#include "redco/ops/matmul_batch.hpp"

namespace redco {
namespace {

std::atomic<bool> g_allow_tf32{false};
constexpr int kMaxDevices = 16;
// cuBLAS would otherwise cudaMalloc its own workspace inside a step.
constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;

void cublas_check(cublasStatus_t s, const char* what) {
  REDCO_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLAS error in {}: {} ({})", what,
              cuda::cublas().status_string(s), cuda::cublas().status_name(s));
}

// One handle per device, bound to the device's stream, with a workspace
// taken from redco's caching allocator.
cublasHandle_t handle(Device dev) {
  static std::array<cublasHandle_t, kMaxDevices> handles{};
  static std::array<Tensor, kMaxDevices> workspaces;
  static std::mutex mu;
  REDCO_CHECK(dev.index >= 0 && dev.index < kMaxDevices, "matmul: bad device {}", dev.str());
  std::lock_guard lock(mu);
  cublasHandle_t& h = handles[size_t(dev.index)];
  if (!h) {
    const cuda::CublasApi& api = cuda::cublas();  // opens cuBLAS on the first GPU GEMM
    cublas_check(api.create(&h), "cublasCreate");
    cublas_check(api.set_stream(h, cuda::stream()), "cublasSetStream");
    Tensor& ws = workspaces[size_t(dev.index)];
    ws = Tensor::empty({kWorkspaceBytes}, DType::u8, dev);
    cublas_check(api.set_workspace(h, ws.device_ptr(), size_t(kWorkspaceBytes)),
                 "cublasSetWorkspace");
  }
  return h;
}

using namespace matmul_detail;

struct Gemm {
  bool ta, tb;
  int64_t M, N, K, lda, ldb;
  cudaDataType_t in_type;
  size_t elem;  // bytes per input element
};

// What a composite op's GEMM adds (gemm.hpp): C's row pitch (0: N), alpha,
// and TF32 tensor cores even where set_allow_tf32 is off.
struct GemmExtras {
  int64_t ldc = 0;
  float alpha = 1.f;
  bool tf32 = false;
};

// count GEMMs C_i = alpha op(A_i) op(B_i) + beta C_i, A_i = A + i * stride_a
// elements, etc.: redco's one call into cuBLAS.
void gemm_batched(cublasHandle_t h, const Gemm& g, int64_t count, const void* A, int64_t stride_a,
                  const void* B, int64_t stride_b, float* C, int64_t stride_c, float beta = 0.f,
                  const GemmExtras& x = {}) {
  const cublasComputeType_t compute = g.in_type == CUDA_R_32F && (g_allow_tf32 || x.tf32)
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  cublas_check(cuda::cublas().gemm_strided_batched_ex(
                   h, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(g.N),
                   int(g.M), int(g.K), &x.alpha, B, g.in_type, int(g.ldb), stride_b, A, g.in_type,
                   int(g.lda), stride_a, &beta, C, CUDA_R_32F, int(x.ldc ? x.ldc : g.N), stride_c,
                   int(count), compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

void run_batched(cublasHandle_t h, const Gemm& g, const Batch& bt, const char* A, const char* B,
                 float* C) {
  const int64_t mat_c = g.M * g.N;
  if (bt.rank == 0) return gemm_batched(h, g, 1, A, 0, B, 0, C, mat_c);
  const size_t in = size_t(bt.rank - 1);
  int64_t outer = 1;
  for (size_t d = 0; d < in; ++d) outer *= bt.dims[d];
  for (int64_t o = 0; o < outer; ++o) {
    int64_t off_a = 0, off_b = 0, rest = o;
    for (size_t d = in; d-- > 0;) {
      const int64_t idx = rest % bt.dims[d];
      rest /= bt.dims[d];
      off_a += idx * bt.sa[d];
      off_b += idx * bt.sb[d];
    }
    gemm_batched(h, g, bt.dims[in], A + off_a * int64_t(g.elem), bt.sa[in],
                 B + off_b * int64_t(g.elem), bt.sb[in], C + o * bt.dims[in] * mat_c, mat_c);
  }
}

// The operands a GEMM reads, and its input type in g. Two bf16 (or two f16)
// operands go as they are: their products are exact in fp32 and accumulate in
// fp32. Under Precision::bf16, f32 operands are rounded to bf16 first (nearest
// even, as the CPU backend rounds them), so that the GEMM runs on the bf16
// tensor cores with the CPU's numerics up to summation order. Anything else
// is converted to f32.
std::pair<Tensor, Tensor> gemm_operands(const Tensor& a, const Tensor& b, Gemm& g) {
  auto bf16_or_f32 = [](const Tensor& x) {
    return x.dtype() == DType::bf16 || x.dtype() == DType::f32;
  };
  if (matmul_precision() == Precision::bf16 && bf16_or_f32(a) && bf16_or_f32(b)) {
    g.in_type = CUDA_R_16BF;
    g.elem = 2;
    return {a.to(DType::bf16), b.to(DType::bf16)};
  }
  if (a.dtype() == b.dtype() && a.dtype() != DType::f32) {
    g.in_type = a.dtype() == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
    g.elem = 2;
    return {a, b};
  }
  return {a.to(DType::f32), b.to(DType::f32)};
}

}  // namespace

namespace cuda {
void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

void gemm_f32(Device dev, const StridedGemm& g, const float* A, const float* B, float* C) {
  if (g.count == 0 || g.M == 0 || g.N == 0) return;
  const Gemm f32{g.ta, g.tb, g.M, g.N, g.K, g.lda, g.ldb, CUDA_R_32F, 4};
  gemm_batched(handle(dev), f32, g.count, A, g.sa, B, g.sb, C, g.sc, 0.f,
               {.ldc = g.ldc, .alpha = g.alpha, .tf32 = g.tf32});
}
}  // namespace cuda

Tensor CudaBackend::matmul(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  const Device dev = a_in.device();
  cuda::Scope scope(dev);
  cuda::expect_on(b_in, dev, "matmul");
  const Shape& as = a_in.shape();
  const Shape& bs = b_in.shape();
  // Shapes are checked by meta::matmul; encoded weights (int8 rows, decode
  // panels) are CPU formats the GEMMs here cannot read.
  REDCO_CHECK(is_floating(a_in.dtype()) && is_floating(b_in.dtype()),
              "matmul: the CUDA backend takes floating-point operands, got {} {} and {} {} "
              "(int8 weights are CPU formats: dequantize them first)",
              dtype_name(a_in.dtype()), as, dtype_name(b_in.dtype()), bs);
  const int64_t ar = as[-2], ac = as[-1], br = bs[-2], bc = bs[-1];
  Gemm g{trans_a,    trans_b, trans_a ? ac : ar, trans_b ? br : bc, trans_a ? ar : ac, ac, bc,
         CUDA_R_32F, 4};
  const Batch bt = broadcast_batch(as, bs, ar * ac, br * bc);
  Tensor c = Tensor::empty(meta::matmul_shape(as, bs, trans_a, trans_b), DType::f32, dev);
  if (c.numel() == 0) return c;
  if (g.K == 0) {  // an empty sum
    c.fill(0.f);
    return c;
  }
  auto [a, b] = gemm_operands(a_in, b_in, g);
  const auto* pa = static_cast<const char*>(a.device_ptr());
  const auto* pb = static_cast<const char*>(b.device_ptr());
  if (bs.rank() == 2 && !trans_a) {
    // Linear-layer fast path: a's rows are contiguous across its batch dims.
    Gemm flat = g;
    flat.M = a.numel() / g.K;
    gemm_batched(handle(dev), flat, 1, pa, 0, pb, 0, c.device_data<float>(), 0);
    return c;
  }
  run_batched(handle(dev), g, bt, pa, pb, c.device_data<float>());
  return c;
}

void CudaBackend::matmul_into(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b,
                              Tensor& c, bool accumulate) {
  const Device dev = a_in.device();
  cuda::Scope scope(dev);
  cuda::expect_on(b_in, dev, "matmul_into");
  cuda::expect_on(c, dev, "matmul_into");
  const auto [M, N, K] = into_dims(a_in, b_in, trans_a, trans_b, c);
  if (M * N == 0) return;
  if (K == 0) {  // an empty sum adds nothing
    if (!accumulate) c.fill(0.f);
    return;
  }
  Gemm g{trans_a, trans_b, M, N, K, a_in.dim(1), b_in.dim(1), CUDA_R_32F, 4};
  const auto [a, b] = gemm_operands(a_in, b_in, g);
  gemm_batched(handle(dev), g, 1, a.device_ptr(), 0, b.device_ptr(), 0, c.device_data<float>(), 0,
               accumulate ? 1.f : 0.f);
}

}  // namespace redco
