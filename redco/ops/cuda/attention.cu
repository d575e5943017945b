// Scaled-dot-product attention on CUDA, as cuBLAS GEMMs around two row
// kernels, with every option of the CPU kernel (causal with per-row offsets,
// per-row key ranges, grouped-query heads, an additive bias, lse saved for
// backward).
//
// Why GEMMs and not a fused flash kernel: the products are where the FLOPs
// are, and cuBLAS runs them on the tensor cores; the price is the score
// matrix S [B, Hq, Tq, Tk] in device memory (transient: forward frees it,
// backward recomputes it from the saved lse), which a flash kernel would keep
// on chip. The reference kernel this replaces (a block per query row, dK/dV
// summed over the queries with strided reads) took ~1.3 s for one GPT-2 124M
// step at batch 16 x 1024 on an H200.
//
// Grouped-query heads need no copies: the query heads of one kv head are
// adjacent in q [B, Hq, Tq, D], so the G = Hq / Hkv of them form one
// [G*Tq, D] matrix against that head's K [Tk, D] (backend_cuda_attention.cpp).
//
// Forward:  S = scale Q K^T (GEMM); P = softmax of S + bias over the visible
//           keys, in place, lse saved (attn_softmax_rows); O = P V (GEMM).
// Backward: S and P again from lse; dP = dO V^T (GEMM);
//           dS = P (dP - Delta), Delta_i = dO_i . O_i (attn_grad_rows);
//           dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO (GEMMs; the
//           transposed ones sum over the G query heads of a kv head).
#include <cfloat>

#include "redco/ops/cuda/attention_cuda.hpp"
#include "redco/ops/cuda/block_reduce.cuh"
#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

struct Visible {
  int64_t lo, hi;  // the keys query i of batch row b sees: [lo, hi), possibly empty
};
__device__ Visible visible_keys(const AttentionArgs& a, int64_t b, int64_t i) {
  const int64_t begin = a.key_begin ? a.key_begin[b] : 0;
  const int64_t end = a.key_end ? a.key_end[b] : a.Tk;
  const int64_t off = a.causal_offset ? a.causal_offset[b] : a.Tk - a.Tq;
  int64_t hi = end;
  if (a.causal) {
    int64_t causal_end = i + off + 1;  // clamped to [0, Tk]
    causal_end = causal_end < 0 ? 0 : (causal_end > a.Tk ? a.Tk : causal_end);
    hi = hi < causal_end ? hi : causal_end;
  }
  return {begin, hi > begin ? hi : begin};
}

// One block per row r of [B, Hq, Tq]: its batch row, head and query index.
struct Row {
  int64_t b, h, i;
};
__device__ Row row_of(const AttentionArgs& a, int64_t r) {
  return {r / (a.Hq * a.Tq), (r / a.Tq) % a.Hq, r % a.Tq};
}

__device__ const float* bias_row(const AttentionArgs& a, Row w) {
  if (!a.bias) return nullptr;
  const int64_t head_row = w.h * a.Tq + w.i;
  return a.bias + ((a.bias_per_row ? w.b * a.Hq * a.Tq : 0) + head_row) * a.Tk;
}

// S row (scaled scores) -> P row in place: exp(s + bias - lse) on the visible
// keys, 0 elsewhere. lse_out: computes and writes lse (forward); else reads
// lse_in (backward; -inf for a row that sees no key, whose P is all 0).
__global__ void attn_softmax_rows(AttentionArgs a, float* S, float* lse_out, const float* lse_in) {
  __shared__ float red[kRowThreads / 32];
  const int64_t r = blockIdx.x, Tk = a.Tk;
  const Row w = row_of(a, r);
  const Visible vis = visible_keys(a, w.b, w.i);
  const float* bias = bias_row(a, w);
  float* s = S + r * Tk;
  float lse;
  if (lse_out) {
    float m = -FLT_MAX;
    for (int64_t j = vis.lo + threadIdx.x; j < vis.hi; j += blockDim.x)
      m = fmaxf(m, s[j] + (bias ? bias[j] : 0.f));
    m = block_max(m, red);
    float l = 0.f;
    for (int64_t j = vis.lo + threadIdx.x; j < vis.hi; j += blockDim.x)
      l += __expf(s[j] + (bias ? bias[j] : 0.f) - m);
    l = block_sum(l, red);
    lse = vis.hi == vis.lo ? -INFINITY : m + logf(l);
    if (threadIdx.x == 0) lse_out[r] = lse;
  } else {
    lse = lse_in[r];
  }
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    const bool in = j >= vis.lo && j < vis.hi;
    s[j] = in ? __expf(s[j] + (bias ? bias[j] : 0.f) - lse) : 0.f;
  }
}

// dP row -> dS row in place: P (dP - Delta), Delta = dO_r . O_r; also the
// bias gradient's row (dS itself) when dbias is non-null.
__global__ void attn_grad_rows(AttentionArgs a, const float* P, float* dP, const float* o,
                               const float* dout, float* dbias) {
  __shared__ float red[kRowThreads / 32];
  const int64_t r = blockIdx.x, Tk = a.Tk, D = a.D;
  float delta = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) delta += dout[r * D + d] * o[r * D + d];
  delta = block_sum(delta, red);
  const float* p = P + r * Tk;
  float* g = dP + r * Tk;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    const float ds = p[j] * (g[j] - delta);  // P is 0 off the visible keys, so is dS
    g[j] = ds;
    if (dbias) dbias[r * Tk + j] = ds;
  }
}

}  // namespace

void attention_softmax_rows(const AttentionArgs& a, float* S, float* lse_out, const float* lse_in) {
  const int64_t rows = a.B * a.Hq * a.Tq;
  if (rows == 0) return;
  attn_softmax_rows<<<unsigned(rows), kRowThreads, 0, stream()>>>(a, S, lse_out, lse_in);
  check_launch("attention softmax");
}

void attention_grad_rows(const AttentionArgs& a, const float* P, float* dP, const float* o,
                         const float* dout, float* dbias) {
  const int64_t rows = a.B * a.Hq * a.Tq;
  if (rows == 0) return;
  attn_grad_rows<<<unsigned(rows), kRowThreads, 0, stream()>>>(a, P, dP, o, dout, dbias);
  check_launch("attention backward (rows)");
}

}  // namespace redco::cuda::k
