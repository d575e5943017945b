// CudaBackend::attention and its backward (shapes and extras checked by
// meta::attention): cuBLAS GEMMs around the row kernels of attention.cu (which
// says why). The per-row extras (key ranges, causal offsets) arrive as i64
// [B] tensors; the CPU backend reads them on the host, so callers make them
// there; meta::attention validates them there, and they are copied to the
// device (B values: one small copy per call).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "redco/core/error.hpp"
#include "redco/ops/cuda/attention_cuda.hpp"
#include "redco/ops/cuda/backend_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/gemm.hpp"
#include "redco/ops/cuda/tensor_util.hpp"
#include "redco/ops/paged_kv.hpp"

namespace redco {
namespace {

cuda::k::AttentionArgs attention_args(const Tensor& q, const Tensor& k, bool causal, float scale) {
  // Shapes are checked by meta::attention; cuBLAS takes int dims and leading dimensions.
  REDCO_CHECK(q.dim(1) / k.dim(1) * q.dim(2) <= INT32_MAX && k.dim(2) <= INT32_MAX,
              "attention: {} query rows per kv head and {} keys exceed the CUDA GEMMs' int "
              "dimensions; split the batch or the sequence",
              q.dim(1) / k.dim(1) * q.dim(2), k.dim(2));
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), scale, causal};
}

// The extras of one call on the device; `keep` holds the copies alive.
struct DeviceExtras {
  Tensor begin, end, offset, bias;
};

// An i64 [B] extra (checked by meta::attention) as a device tensor.
Tensor row_values(const Tensor& t, Device dev) { return t.device() == dev ? t : t.to(dev); }

DeviceExtras attach(cuda::k::AttentionArgs& a, const AttentionExtras& x, Device dev) {
  DeviceExtras d;
  if (x.key_begin.defined()) {
    d.begin = row_values(x.key_begin, dev);
    d.end = row_values(x.key_end, dev);
    a.key_begin = d.begin.device_data<int64_t>();
    a.key_end = d.end.device_data<int64_t>();
  }
  if (x.causal_offset.defined()) {
    d.offset = row_values(x.causal_offset, dev);
    a.causal_offset = d.offset.device_data<int64_t>();
  }
  if (x.bias.defined()) {
    d.bias = cuda::f32(x.bias, dev, "attention bias");
    a.bias_per_row = d.bias.shape() == (Shape{a.B, a.Hq, a.Tq, a.Tk});
    a.bias = d.bias.device_data<float>();
  }
  return d;
}

Tensor like(const Tensor& x) { return Tensor::empty(x.shape(), DType::f32, x.device()); }

// The GEMMs of one call, per kv head (batch index n over [B, Hkv]): the G
// query heads of kv head n are the rows [G*Tq] of one matrix. Operands that
// were bf16 (mixed precision) run on TF32 tensor cores: bf16 values are exact
// in TF32, and P, dS lose what a bf16 kernel's would.
struct AttentionGemms {
  const cuda::k::AttentionArgs& a;
  Device dev;
  bool tf32;
  int64_t rows() const { return a.Hq / a.Hkv * a.Tq; }
  // out[rows, Tk] = alpha x[rows, D] y[Tk, D]^T  (S from q and k; dP from dO and v)
  void rows_by_keys(const float* x, const float* y, float* out, float alpha) const {
    gemm(false, true, rows(), a.Tk, a.D, a.D, a.D, a.Tk, rows() * a.D, a.Tk * a.D, rows() * a.Tk,
         alpha, x, y, out);
  }
  // out[rows, D] = alpha m[rows, Tk] y[Tk, D]  (O = P V; dQ = scale dS K)
  void rows_by_dim(const float* m, const float* y, float* out, float alpha) const {
    gemm(false, false, rows(), a.D, a.Tk, a.Tk, a.D, a.D, rows() * a.Tk, a.Tk * a.D, rows() * a.D,
         alpha, m, y, out);
  }
  // out[Tk, D] = alpha m[rows, Tk]^T x[rows, D]  (dK = scale dS^T Q; dV = P^T dO)
  void keys_by_dim(const float* m, const float* x, float* out, float alpha) const {
    gemm(true, false, a.Tk, a.D, rows(), a.Tk, a.D, a.D, rows() * a.Tk, rows() * a.D, a.Tk * a.D,
         alpha, m, x, out);
  }

 private:
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
            int64_t ldc, int64_t sa, int64_t sb, int64_t sc, float alpha, const float* A,
            const float* B, float* C) const {
    cuda::gemm_f32(dev,
                   {.ta = ta,
                    .tb = tb,
                    .M = M,
                    .N = N,
                    .K = K,
                    .lda = lda,
                    .ldb = ldb,
                    .ldc = ldc,
                    .sa = sa,
                    .sb = sb,
                    .sc = sc,
                    .count = a.B * a.Hkv,
                    .alpha = alpha,
                    .tf32 = tf32},
                   A, B, C);
  }
};

bool mixed(const Tensor& q, const Tensor& k, const Tensor& v) {
  return q.dtype() == DType::bf16 && k.dtype() == DType::bf16 && v.dtype() == DType::bf16;
}

// The flash forward (flash_attention.cu) while it is being proven on a GPU:
// only when REDCO_CUDA_ATTENTION=flash, on bf16 operands with 16-byte aligned
// rows, in the cases it covers; else the GEMM path.
bool flash_requested(const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* e = std::getenv("REDCO_CUDA_ATTENTION");
  return e && std::string_view(e) == "flash" && mixed(q, k, v);
}
bool flash_fits(const Tensor& q, const Tensor& k, const Tensor& v,
                const cuda::k::AttentionArgs& a) {
  auto aligned = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.device_ptr()) % 16 == 0;
  };
  return cuda::k::flash_attention_supported(a) && aligned(q) && aligned(k) && aligned(v);
}

// dq, dk, dv by the flash backward (flash_attention_bwd.cu) from the
// forward's o and lse (f32, on the device, as the forward left them).
TensorList flash_backward(const cuda::k::AttentionArgs& a, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& dout) {
  const Device dev = q.device();
  const char* op = "attention backward";
  cuda::expect_on(o, dev, op);
  cuda::expect_on(lse, dev, op);
  REDCO_CHECK(o.dtype() == DType::f32,
              "attention backward: the flash kernel reads the output as f32, got {}",
              dtype_name(o.dtype()));
  Tensor dq = Tensor::empty(q.shape(), DType::f32, dev),
         dk = Tensor::empty(k.shape(), DType::f32, dev),
         dv = Tensor::empty(v.shape(), DType::f32, dev);
  Tensor dout_bf16 = Tensor::empty(q.shape(), DType::bf16, dev);  // scratch
  Tensor delta = Tensor::empty(lse.shape(), DType::f32, dev);     // scratch
  cuda::k::flash_attention_backward(a, q.device_ptr(), k.device_ptr(), v.device_ptr(),
                                    o.device_data<float>(), lse.device_data<float>(),
                                    dout.device_data<float>(), dout_bf16.device_ptr(),
                                    delta.device_data<float>(), dq.device_data<float>(),
                                    dk.device_data<float>(), dv.device_data<float>());
  return {dq, dk, dv};
}

}  // namespace

Tensor CudaBackend::attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                              bool causal, float scale, Tensor& lse, const AttentionExtras& x) {
  if (x.block_table.defined()) {  // a paged KV cache: its blocks gathered into rows
    AttentionExtras rows = x;
    rows.block_table = Tensor();
    return attention(q_in, gather_paged_kv(k_in, x.block_table),
                     gather_paged_kv(v_in, x.block_table), causal, scale, lse, rows);
  }
  const Device dev = q_in.device();
  cuda::Scope scope(dev);
  cuda::expect_on(k_in, dev, "attention");
  cuda::expect_on(v_in, dev, "attention");
  if (flash_requested(q_in, k_in, v_in)) {
    auto fa = attention_args(q_in, k_in, causal, scale);
    const DeviceExtras keep = attach(fa, x, dev);
    if (flash_fits(q_in, k_in, v_in, fa)) {
      Tensor o = Tensor::empty(q_in.shape(), DType::f32, dev);
      lse = Tensor::empty({fa.B, fa.Hq, fa.Tq}, DType::f32, dev);
      cuda::k::flash_attention_forward(fa, q_in.device_ptr(), k_in.device_ptr(), v_in.device_ptr(),
                                       o.device_data<float>(), lse.device_data<float>());
      return o;
    }
  }
  Tensor q = cuda::f32(q_in, dev, "attention"), k = cuda::f32(k_in, dev, "attention"),
         v = cuda::f32(v_in, dev, "attention");
  auto a = attention_args(q, k, causal, scale);
  const DeviceExtras keep = attach(a, x, dev);
  Tensor o = like(q);
  lse = Tensor::empty({a.B, a.Hq, a.Tq}, DType::f32, dev);
  const AttentionGemms g{a, dev, mixed(q_in, k_in, v_in)};
  // S [B, Hq, Tq, Tk], then P in place: transient, freed on return.
  Tensor S = Tensor::empty({a.B, a.Hq, a.Tq, a.Tk}, DType::f32, dev);
  g.rows_by_keys(q.device_data<float>(), k.device_data<float>(), S.device_data<float>(), scale);
  cuda::k::attention_softmax_rows(a, S.device_data<float>(), lse.device_data<float>(), nullptr);
  g.rows_by_dim(S.device_data<float>(), v.device_data<float>(), o.device_data<float>(), 1.f);
  return o;
}

TensorList CudaBackend::attention_backward(const Tensor& q_in, const Tensor& k_in,
                                           const Tensor& v_in, const Tensor& o, const Tensor& lse,
                                           const Tensor& dout_in, bool causal, float scale,
                                           const AttentionExtras& x) {
  const Device dev = q_in.device();
  cuda::Scope scope(dev);
  const char* op = "attention backward";
  if (flash_requested(q_in, k_in, v_in)) {
    auto fa = attention_args(q_in, k_in, causal, scale);
    const DeviceExtras keep = attach(fa, x, dev);
    if (cuda::k::flash_attention_backward_supported(fa) && flash_fits(q_in, k_in, v_in, fa))
      return flash_backward(fa, q_in, k_in, v_in, o, lse, cuda::f32(dout_in, dev, op));
  }
  Tensor q = cuda::f32(q_in, dev, op), k = cuda::f32(k_in, dev, op), v = cuda::f32(v_in, dev, op);
  Tensor dout = cuda::f32(dout_in, dev, op);
  cuda::expect_on(o, dev, op);
  cuda::expect_on(lse, dev, op);
  auto a = attention_args(q, k, causal, scale);
  const DeviceExtras keep = attach(a, x, dev);
  Tensor dq = like(q), dk = like(k), dv = like(v);
  const Shape rows{a.B, a.Hq, a.Tq, a.Tk};
  Tensor P = Tensor::empty(rows, DType::f32, dev), dS = Tensor::empty(rows, DType::f32, dev);
  Tensor dbias_rows = a.bias ? Tensor::empty(rows, DType::f32, dev) : Tensor();
  const AttentionGemms g{a, dev, mixed(q_in, k_in, v_in)};
  float *p = P.device_data<float>(), *ds = dS.device_data<float>();
  g.rows_by_keys(q.device_data<float>(), k.device_data<float>(), p, scale);
  cuda::k::attention_softmax_rows(a, p, nullptr, lse.device_data<float>());
  g.rows_by_keys(dout.device_data<float>(), v.device_data<float>(), ds, 1.f);  // dP
  cuda::k::attention_grad_rows(a, p, ds, o.device_data<float>(), dout.device_data<float>(),
                               a.bias ? dbias_rows.device_data<float>() : nullptr);
  g.rows_by_dim(ds, k.device_data<float>(), dq.device_data<float>(), scale);
  g.keys_by_dim(ds, q.device_data<float>(), dk.device_data<float>(), scale);
  g.keys_by_dim(p, dout.device_data<float>(), dv.device_data<float>(), 1.f);
  if (!a.bias) return {dq, dk, dv};
  if (a.bias_per_row) return {dq, dk, dv, dbias_rows};
  // Summed over the batch rows in order: [B, Hq*Tq*Tk] -> [Hq, Tq, Tk].
  Tensor dbias = Tensor::empty({a.Hq, a.Tq, a.Tk}, DType::f32, dev);
  cuda::k::reduce_pass(false, dbias_rows.device_data<float>(), dbias.device_data<float>(), 1, a.B,
                       a.Hq * a.Tq * a.Tk);
  return {dq, dk, dv, dbias};
}

}  // namespace redco
