// Scaled-dot-product attention on CUDA: a reference implementation with
// every option of the CPU kernel (causal with per-row offsets, per-row key
// ranges, grouped-query heads, an additive bias, lse saved for backward).
//
// Why not flash yet: this is the correct-first version the GPU check compares
// against the CPU's flash kernel; it keeps one query row's scores in shared
// memory (Tk floats), so it handles any length up to kMaxKeys, and its
// backward materialises P and dS ([B, Hq, Tq, Tk]) so that dK/dV are
// sequential sums over the queries: deterministic, no atomics. A tiled flash
// kernel (or cuDNN's SDPA) replaces it once it can be measured on a GPU.
//
// Forward: one block per (query row, head, batch row); a warp per key computes
//   s_j = scale * q_i . k_j + bias_ij  for the visible keys j in [lo, hi),
// then lse = log sum exp s, o_i = sum_j exp(s_j - lse) v_j (threads over D).
// Backward pass 1 (per query row): P_ij = exp(s_ij - lse_i), dP_ij = dO_i . v_j,
// dS_ij = P_ij (dP_ij - Delta_i) with Delta_i = dO_i . O_i, dQ_i = scale sum_j dS_ij k_j.
// Pass 2 (per key row of each kv head): dV_j = sum_{h in group, i} P_ij dO_i,
// dK_j = scale sum dS_ij q_i.
#include <cfloat>

#include "redco/ops/cuda/attention_cuda.hpp"
#include "redco/ops/cuda/block_reduce.cuh"
#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

constexpr int kWarps = kRowThreads / 32;

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

__device__ const float* bias_row(const AttentionArgs& a, int64_t b, int64_t h, int64_t i) {
  if (!a.bias) return nullptr;
  const int64_t head_row = h * a.Tq + i;
  return a.bias + ((a.bias_per_row ? b * a.Hq * a.Tq : 0) + head_row) * a.Tk;
}

// s[j - lo] = scale * x . y_j (+ bias) for j in [lo, hi): a warp per key, lanes over D.
__device__ void row_dots(const float* x, const float* y, const float* bias, Visible v, int64_t D,
                         float scale, float* s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t j = v.lo + warp; j < v.hi; j += kWarps) {
    const float* yj = y + j * D;
    float acc = 0.f;
    for (int64_t d = lane; d < D; d += 32) acc += x[d] * yj[d];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) s[j - v.lo] = acc * scale + (bias ? bias[j] : 0.f);
  }
  __syncthreads();
}

__global__ void attn_fwd(AttentionArgs a, const float* q, const float* k, const float* v, float* o,
                         float* lse) {
  extern __shared__ float s[];  // [Tk] scores of this query row
  __shared__ float red[kWarps];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, D = a.D;
  const int64_t hk = h / (a.Hq / a.Hkv), row = (b * a.Hq + h) * a.Tq + i;
  const float* kb = k + (b * a.Hkv + hk) * a.Tk * D;
  const float* vb = v + (b * a.Hkv + hk) * a.Tk * D;
  const Visible vis = visible_keys(a, b, i);
  row_dots(q + row * D, kb, bias_row(a, b, h, i), vis, D, a.scale, s);
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < vis.hi - vis.lo; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_max(m, red);
  float l = 0.f;
  for (int64_t j = threadIdx.x; j < vis.hi - vis.lo; j += blockDim.x) l += __expf(s[j] - m);
  l = block_sum(l, red);
  const bool none = vis.hi == vis.lo;  // a query that sees no key: o = 0, lse = -inf
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = vis.lo; j < vis.hi; ++j) acc += __expf(s[j - vis.lo] - m) * vb[j * D + d];
    o[row * D + d] = none ? 0.f : acc / l;
  }
  if (threadIdx.x == 0) lse[row] = none ? -INFINITY : m + logf(l);
}

// Pass 1: P and dS rows (zero where not visible), dQ, and the bias gradient rows.
__global__ void attn_bwd_rows(AttentionArgs a, const float* q, const float* k, const float* v,
                              const float* o, const float* lse, const float* dout, float* dq,
                              float* P, float* dS, float* dbias) {
  extern __shared__ float s[];  // [2 * Tk]: scores, then dP
  __shared__ float red[kWarps];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, D = a.D, Tk = a.Tk;
  const int64_t hk = h / (a.Hq / a.Hkv), row = (b * a.Hq + h) * a.Tq + i;
  const float* kb = k + (b * a.Hkv + hk) * Tk * D;
  const float* vb = v + (b * a.Hkv + hk) * Tk * D;
  const float *qi = q + row * D, *oi = o + row * D, *gi = dout + row * D;
  const Visible vis = visible_keys(a, b, i);
  row_dots(qi, kb, bias_row(a, b, h, i), vis, D, a.scale, s);
  row_dots(gi, vb, nullptr, vis, D, 1.f, s + Tk);
  float delta = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) delta += gi[d] * oi[d];
  delta = block_sum(delta, red);
  const float l = lse[row];
  float* Pr = P + row * Tk;
  float* dSr = dS + row * Tk;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    const bool in = j >= vis.lo && j < vis.hi;
    const float p = in ? __expf(s[j - vis.lo] - l) : 0.f;
    const float ds = in ? p * (s[Tk + j - vis.lo] - delta) : 0.f;
    Pr[j] = p;
    dSr[j] = ds;
    if (dbias) dbias[row * Tk + j] = ds;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = vis.lo; j < vis.hi; ++j) acc += dSr[j] * kb[j * D + d];
    dq[row * D + d] = acc * a.scale;
  }
}

// Pass 2: one block per (key row, kv head, batch row), summing over the
// queries of every query head in the group in a fixed order.
__global__ void attn_bwd_keys(AttentionArgs a, const float* q, const float* dout, const float* P,
                              const float* dS, float* dk, float* dv) {
  const int64_t j = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, D = a.D, Tk = a.Tk;
  const int64_t group = a.Hq / a.Hkv, kv_row = (b * a.Hkv + hk) * Tk + j;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float gk = 0.f, gv = 0.f;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const int64_t base = (b * a.Hq + h) * a.Tq;
      for (int64_t i = 0; i < a.Tq; ++i) {
        const int64_t r = base + i;
        gv += P[r * Tk + j] * dout[r * D + d];
        gk += dS[r * Tk + j] * q[r * D + d];
      }
    }
    dk[kv_row * D + d] = gk * a.scale;
    dv[kv_row * D + d] = gv;
  }
}

}  // namespace

void attention_forward(const AttentionArgs& a, const float* q, const float* k, const float* v,
                       float* o, float* lse) {
  if (a.B * a.Hq * a.Tq == 0) return;
  const dim3 grid(unsigned(a.Tq), unsigned(a.Hq), unsigned(a.B));
  attn_fwd<<<grid, kRowThreads, size_t(a.Tk) * sizeof(float), stream()>>>(a, q, k, v, o, lse);
  check_launch("attention");
}

void attention_backward(const AttentionArgs& a, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* dout, float* dq, float* dk,
                        float* dv, float* P, float* dS, float* dbias) {
  if (a.B * a.Hq * a.Tq > 0) {
    const dim3 grid(unsigned(a.Tq), unsigned(a.Hq), unsigned(a.B));
    attn_bwd_rows<<<grid, kRowThreads, 2 * size_t(a.Tk) * sizeof(float), stream()>>>(
        a, q, k, v, o, lse, dout, dq, P, dS, dbias);
    check_launch("attention backward (rows)");
  }
  if (a.B * a.Hkv * a.Tk > 0) {
    const dim3 grid(unsigned(a.Tk), unsigned(a.Hkv), unsigned(a.B));
    attn_bwd_keys<<<grid, 128, 0, stream()>>>(a, q, dout, P, dS, dk, dv);
    check_launch("attention backward (keys)");
  }
}

}  // namespace redco::cuda::k
