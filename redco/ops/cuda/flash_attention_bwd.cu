// Flash attention backward for bf16 q, k, v at head size 64 (mixed
// precision), on the tensor cores; the forward's companion (flash_attention.cu,
// whose STATUS applies here too: written without a GPU, opt-in with
// REDCO_CUDA_ATTENTION=flash until a GPU run has verified and timed it).
//
// Deterministic, no atomics: two kernels, each recomputing the scores from
// q, k and the forward's lse, each owning what it writes.
//   dq:   a block per 64 query rows (4 warps x 16) of one (batch row, head),
//         over the key tiles: S = Q K^T, P = exp(scale S - lse), dP = dO V^T,
//         dS = P (dP - Delta), dQ += scale dS K.
//   dkdv: a block per 64 keys (4 warps x 16) of one (batch row, kv head), over
//         the query heads of its group and their query tiles of 32, in the
//         transposed form so that the keys are the product's rows:
//         S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T (dP^T - Delta),
//         dV += P^T dO, dK += scale dS^T Q.
// dO is rounded to bf16 for the products, P and dS too, and Delta_i = dO_i . O_i
// is taken from that rounded dO (f32 sums, a row kernel first), as FA2 does. Every product is one
// of the forward's two fragment patterns (flash_common.cuh).
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "redco/ops/cuda/attention_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/flash_common.cuh"

namespace redco::cuda::k {
namespace {
using namespace flash;

constexpr int D = 64;       // the head size these kernels take
constexpr int P = D + 8;    // shared row pitch (conflict-free fragment loads)
constexpr int kWarps = 4;   // 16 rows of the product each
constexpr int kTile = 64;   // rows a block owns
constexpr int kQTile = 32;  // query rows a step of dkdv

// delta[r] = dout[r] . o[r] over D, a warp per row, from the bf16 dO the
// products use (dP - Delta then cancels consistently; FA2 does the same).
__global__ void row_delta(const __nv_bfloat16* dout, const float* o, float* delta, int64_t rows) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  float s = __bfloat162float(dout[r * D + lane]) * o[r * D + lane] +
            __bfloat162float(dout[r * D + lane + 32]) * o[r * D + lane + 32];
  for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
  if (lane == 0) delta[r] = s;
}

// The backward's paired products against the rows of two tiles, over NT
// tiles of 8 of their rows: x += fx tx^T and y += fy ty^T (16 x 8 NT each).
template <int NT>
__device__ __forceinline__ void against_rows(float (&x)[NT][4], const uint32_t (&fx)[D / 16][4],
                                             const __nv_bfloat16* tx, float (&y)[NT][4],
                                             const uint32_t (&fy)[D / 16][4],
                                             const __nv_bfloat16* ty) {
  for (int n = 0; n < NT; ++n)
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b0, b1;
      b_from_rows(b0, b1, tx, P, n * 8, kk * 16);
      mma(x[n], fx[kk], b0, b1);
      b_from_rows(b0, b1, ty, P, n * 8, kk * 16);
      mma(y[n], fy[kk], b0, b1);
    }
}

__global__ void __launch_bounds__(kWarps * 32)
    flash_bwd_dq(AttentionArgs a, const __nv_bfloat16* q, const __nv_bfloat16* k,
                 const __nv_bfloat16* v, const __nv_bfloat16* dout, const float* lse,
                 const float* delta, float* dq) {
  __shared__ __align__(16) __nv_bfloat16 qs[kTile * P], dos[kTile * P], ks[kTile * P],
      vs[kTile * P];
  const int64_t q0 = int64_t(blockIdx.x) * kTile, h = blockIdx.y, b = blockIdx.z;
  const int64_t hk = h / (a.Hq / a.Hkv), base = (b * a.Hq + h) * a.Tq;
  const __nv_bfloat16* kb = k + (b * a.Hkv + hk) * a.Tk * D;
  const __nv_bfloat16* vb = v + (b * a.Hkv + hk) * a.Tk * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  RowRange vis[2];
  float l[2], dl[2];  // lse and Delta of the thread's two rows (+inf: a row past Tq, P = 0)
  for (int i = 0; i < 2; ++i) {
    vis[i] = visible(a, b, row[i]);
    l[i] = row[i] < a.Tq ? lse[base + row[i]] : INFINITY;
    dl[i] = row[i] < a.Tq ? delta[base + row[i]] : 0.f;
  }
  const RowRange first = visible(a, b, q0);
  const RowRange last = visible(a, b, q0 + kTile - 1 < a.Tq ? q0 + kTile - 1 : a.Tq - 1);
  const int64_t k_lo = first.lo < last.lo ? first.lo : last.lo;
  const int64_t k_hi = first.hi > last.hi ? first.hi : last.hi;
  load_tile<D, P>(qs, q + base * D, q0, a.Tq, kTile);
  load_tile<D, P>(dos, dout + base * D, q0, a.Tq, kTile);
  __syncthreads();
  uint32_t qf[D / 16][4], df[D / 16][4];
  for (int kk = 0; kk < D / 16; ++kk) {
    a_frag(qf[kk], qs, P, warp * 16, kk * 16);
    a_frag(df[kk], dos, P, warp * 16, kk * 16);
  }
  float acc[D / 8][4] = {};  // dQ, 16 x D
  for (int64_t j0 = k_lo / kTile * kTile; j0 < k_hi; j0 += kTile) {
    __syncthreads();
    load_tile<D, P>(ks, kb, j0, a.Tk, kTile);
    load_tile<D, P>(vs, vb, j0, a.Tk, kTile);
    __syncthreads();
    float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    against_rows(s, qf, ks, dp, df, vs);  // S = Q K^T, dP = dO V^T
    uint32_t dsf[kTile / 16][4];          // dS as A fragments over the tile's keys
    for (int n = 0; n < kTile / 8; ++n) {
      float ds[4];
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const int64_t j = j0 + n * 8 + 2 * t + (e & 1);
        const float p = j >= vis[r].lo && j < vis[r].hi ? __expf(s[n][e] * a.scale - l[r]) : 0.f;
        ds[e] = p * (dp[n][e] - dl[r]);
      }
      c_to_a(dsf, n, ds[0], ds[1], ds[2], ds[3]);
    }
    against_cols(acc, dsf, ks, P);  // dQ += dS K
  }
  for (int d = 0; d < D / 8; ++d)
    for (int e = 0; e < 4; ++e) {
      const int64_t r = row[e / 2];
      if (r < a.Tq) dq[(base + r) * D + d * 8 + 2 * t + (e & 1)] = acc[d][e] * a.scale;
    }
}

__global__ void __launch_bounds__(kWarps * 32)
    flash_bwd_dkdv(AttentionArgs a, const __nv_bfloat16* q, const __nv_bfloat16* k,
                   const __nv_bfloat16* v, const __nv_bfloat16* dout, const float* lse,
                   const float* delta, float* dk, float* dv) {
  __shared__ __align__(16) __nv_bfloat16 ks[kTile * P], vs[kTile * P], qs[kQTile * P],
      dos[kQTile * P];
  __shared__ float ls[kQTile], dls[kQTile];
  __shared__ int64_t vlo[kQTile], vhi[kQTile];  // the keys each query of the tile sees
  const int64_t j0 = int64_t(blockIdx.x) * kTile, hk = blockIdx.y, b = blockIdx.z;
  const int64_t group = a.Hq / a.Hkv, kv = (b * a.Hkv + hk) * a.Tk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t key[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};
  load_tile<D, P>(ks, k + kv * D, j0, a.Tk, kTile);
  load_tile<D, P>(vs, v + kv * D, j0, a.Tk, kTile);
  __syncthreads();
  uint32_t kf[D / 16][4], vf[D / 16][4];  // this warp's 16 keys of K and V
  for (int kk = 0; kk < D / 16; ++kk) {
    a_frag(kf[kk], ks, P, warp * 16, kk * 16);
    a_frag(vf[kk], vs, P, warp * 16, kk * 16);
  }
  // Causal: query i sees key j only when j < i + off + 1, so the first query
  // tile that can see this block's keys starts at j0 - off.
  const int64_t off = a.causal_offset ? a.causal_offset[b] : a.Tk - a.Tq;
  const int64_t i_first = a.causal && j0 - off > 0 ? (j0 - off) / kQTile * kQTile : 0;
  float dka[D / 8][4] = {}, dva[D / 8][4] = {};
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t base = (b * a.Hq + h) * a.Tq;
    for (int64_t i0 = i_first; i0 < a.Tq; i0 += kQTile) {
      __syncthreads();
      load_tile<D, P>(qs, q + base * D, i0, a.Tq, kQTile);
      load_tile<D, P>(dos, dout + base * D, i0, a.Tq, kQTile);
      for (int i = threadIdx.x; i < kQTile; i += blockDim.x) {
        ls[i] = i0 + i < a.Tq ? lse[base + i0 + i] : INFINITY;
        dls[i] = i0 + i < a.Tq ? delta[base + i0 + i] : 0.f;
        const RowRange r = visible(a, b, i0 + i);
        vlo[i] = r.lo, vhi[i] = r.hi;
      }
      __syncthreads();
      float st[kQTile / 8][4] = {}, dpt[kQTile / 8][4] = {};
      against_rows(st, kf, qs, dpt, vf, dos);            // S^T = K Q^T, dP^T = V dO^T
      uint32_t pf[kQTile / 16][4], dsf[kQTile / 16][4];  // P^T, dS^T over the queries
      for (int n = 0; n < kQTile / 8; ++n) {
        float p[4], ds[4];
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + 2 * t + (e & 1);  // the query's column in the tile
          const int64_t j = key[e / 2];
          p[e] = j >= vlo[c] && j < vhi[c] ? __expf(st[n][e] * a.scale - ls[c]) : 0.f;
          ds[e] = p[e] * (dpt[n][e] - dls[c]);
        }
        c_to_a(pf, n, p[0], p[1], p[2], p[3]);
        c_to_a(dsf, n, ds[0], ds[1], ds[2], ds[3]);
      }
      against_cols(dva, pf, dos, P);  // dV += P^T dO
      against_cols(dka, dsf, qs, P);  // dK += dS^T Q
    }
  }
  for (int d = 0; d < D / 8; ++d)
    for (int e = 0; e < 4; ++e) {
      const int64_t j = key[e / 2];
      if (j >= a.Tk) continue;
      const int64_t at = (kv + j) * D + d * 8 + 2 * t + (e & 1);
      dk[at] = dka[d][e] * a.scale;
      dv[at] = dva[d][e];
    }
}

}  // namespace

bool flash_attention_backward_supported(const AttentionArgs& a) {
  return flash_attention_supported(a) && a.D == D;
}

void flash_attention_backward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                              const float* o, const float* lse, const float* dout, void* dout_bf16,
                              float* delta, float* dq, float* dk, float* dv) {
  const int64_t rows = a.B * a.Hq * a.Tq;
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  const auto* kb = static_cast<const __nv_bfloat16*>(k);
  const auto* vb = static_cast<const __nv_bfloat16*>(v);
  auto* db = static_cast<__nv_bfloat16*>(dout_bf16);
  if (rows > 0) {
    convert(db, DType::bf16, dout, DType::f32, rows * D);
    row_delta<<<unsigned((rows + kWarps - 1) / kWarps), kWarps * 32, 0, stream()>>>(db, o, delta,
                                                                                    rows);
    check_launch("flash attention backward (delta)");
    const dim3 grid(unsigned((a.Tq + kTile - 1) / kTile), unsigned(a.Hq), unsigned(a.B));
    flash_bwd_dq<<<grid, kWarps * 32, 0, stream()>>>(a, qb, kb, vb, db, lse, delta, dq);
    check_launch("flash attention backward (dq)");
  }
  if (a.B * a.Hkv * a.Tk == 0) return;
  const dim3 grid(unsigned((a.Tk + kTile - 1) / kTile), unsigned(a.Hkv), unsigned(a.B));
  flash_bwd_dkdv<<<grid, kWarps * 32, 0, stream()>>>(a, qb, kb, vb, db, lse, delta, dk, dv);
  check_launch("flash attention backward (dk, dv)");
}

}  // namespace redco::cuda::k
