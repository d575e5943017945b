// Flash attention forward for bf16 q, k, v (mixed precision) on the tensor
// cores (mma.sync m16n8k16, sm_80 and later): the scores never leave the chip.
//
// STATUS: written without a GPU at hand; it runs only when REDCO_CUDA_ATTENTION
// is "flash" (backend_cuda_attention.cpp), and test_cuda compares it with the
// CPU. Until a GPU run has passed that test and measured it against the GEMM
// path, the GEMM path stays the default.
//
// A block is 4 warps and 64 query rows of one (batch row, head); each warp owns
// 16 rows. Key tiles of 64 rows of K and V go through shared memory; per tile a
// warp computes S = Q K^T (16 x 64, f32 accumulators), masks it (causal with
// the batch row's offset, the batch row's key range), updates the running row
// max m and sum l (online softmax), rounds P = exp(S - m) to bf16 (as FA2 and
// bf16 SDPA do) and adds P V into its O accumulators. At the end O /= l and
// lse = m + log l (a row that sees no key: O = 0, lse = -inf, as the other
// kernels). The backward: flash_attention_bwd.cu at head size 64, else the GEMM
// path's; both recompute P from lse.
//
// The fragment layouts and the tile helpers: flash_common.cuh.
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "redco/ops/cuda/attention_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/flash_common.cuh"

namespace redco::cuda::k {
namespace {
using namespace flash;

constexpr int kRows = 64;  // query rows a block, 16 per warp
constexpr int kKeys = 64;  // keys a tile
constexpr int kWarps = 4;

// Q, K and V tiles at row pitch D + 8 (52 KB at D = 128: above the 48 KB a
// kernel gets without asking).
template <int D>
constexpr int smem_bytes() {
  return (kRows + 2 * kKeys) * (D + 8) * int(sizeof(__nv_bfloat16));
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    flash_fwd(AttentionArgs a, const __nv_bfloat16* q, const __nv_bfloat16* k,
              const __nv_bfloat16* v, float* o, float* lse) {
  constexpr int P = D + 8;  // row pitch: the fragment loads hit 32 distinct banks
  extern __shared__ __align__(16) unsigned char smem[];  // smem_bytes<D>()
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* ks = qs + kRows * P;
  __nv_bfloat16* vs = ks + kKeys * P;
  const int64_t q0 = int64_t(blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z;
  const int64_t hk = h / (a.Hq / a.Hkv);
  const __nv_bfloat16* qb = q + (b * a.Hq + h) * a.Tq * D;
  const __nv_bfloat16* kb = k + (b * a.Hkv + hk) * a.Tk * D;
  const __nv_bfloat16* vb = v + (b * a.Hkv + hk) * a.Tk * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row0 = q0 + warp * 16 + g, row1 = row0 + 8;  // this thread's two rows
  const RowRange vis0 = visible(a, b, row0), vis1 = visible(a, b, row1);
  // The keys any row of the block sees: the tiles to visit.
  const RowRange first = visible(a, b, q0);
  const RowRange last = visible(a, b, q0 + kRows - 1 < a.Tq ? q0 + kRows - 1 : a.Tq - 1);
  const int64_t k_lo = first.lo < last.lo ? first.lo : last.lo;
  const int64_t k_hi = first.hi > last.hi ? first.hi : last.hi;

  load_tile<D, P>(qs, qb, q0, a.Tq, kRows);
  __syncthreads();
  uint32_t qf[D / 16][4];  // this warp's 16 rows of Q as A fragments
  for (int kk = 0; kk < D / 16; ++kk) a_frag(qf[kk], qs, P, warp * 16, kk * 16);
  float acc[D / 8][4] = {};  // O, 16 x D: D/8 C tiles
  float m0 = -FLT_MAX, m1 = -FLT_MAX, l0 = 0.f, l1 = 0.f;
  for (int64_t j0 = k_lo / kKeys * kKeys; j0 < k_hi; j0 += kKeys) {
    __syncthreads();  // the previous tile's readers are done
    load_tile<D, P>(ks, kb, j0, a.Tk, kKeys);
    load_tile<D, P>(vs, vb, j0, a.Tk, kKeys);
    __syncthreads();
    float s[kKeys / 8][4] = {};  // S, 16 x 64: 8 C tiles
    for (int n = 0; n < kKeys / 8; ++n)
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t b0, b1;
        b_from_rows(b0, b1, ks, P, n * 8, kk * 16);
        mma(s[n], qf[kk], b0, b1);
      }
    // Scale, mask, and the tile's row maxima (over the 4 lanes of a row).
    float mx0 = -FLT_MAX, mx1 = -FLT_MAX;
    for (int n = 0; n < kKeys / 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + n * 8 + 2 * t + (e & 1);
        const RowRange& r = e < 2 ? vis0 : vis1;
        const float x = j >= r.lo && j < r.hi ? s[n][e] * a.scale : -INFINITY;
        s[n][e] = x;
        if (e < 2)
          mx0 = fmaxf(mx0, x);
        else
          mx1 = fmaxf(mx1, x);
      }
    for (int o = 1; o < 4; o <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
    }
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    // -FLT_MAX, not -inf, as the start: exp(-inf - (-FLT_MAX)) is 0, never NaN.
    const float c0 = __expf(m0 - n0), c1 = __expf(m1 - n1);
    m0 = n0, m1 = n1, l0 *= c0, l1 *= c1;
    for (int d = 0; d < D / 8; ++d)
      acc[d][0] *= c0, acc[d][1] *= c0, acc[d][2] *= c1, acc[d][3] *= c1;
    uint32_t pf[kKeys / 16][4];  // P as A fragments, 4 k-steps of 16 keys
    for (int n = 0; n < kKeys / 8; ++n) {
      const float p0 = __expf(s[n][0] - m0), p1 = __expf(s[n][1] - m0);
      const float p2 = __expf(s[n][2] - m1), p3 = __expf(s[n][3] - m1);
      l0 += p0 + p1, l1 += p2 + p3;
      c_to_a(pf, n, p0, p1, p2, p3);
    }
    against_cols(acc, pf, vs, P);  // O += P V
  }
  // Row sums over the 4 lanes of a row.
  for (int o = 1; o < 4; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  const int64_t base = (b * a.Hq + h) * a.Tq;
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  for (int d = 0; d < D / 8; ++d) {
    const int64_t col = d * 8 + 2 * t;
    if (row0 < a.Tq)
      o[(base + row0) * D + col] = acc[d][0] * inv0,
                            o[(base + row0) * D + col + 1] = acc[d][1] * inv0;
    if (row1 < a.Tq)
      o[(base + row1) * D + col] = acc[d][2] * inv1,
                            o[(base + row1) * D + col + 1] = acc[d][3] * inv1;
  }
  if (t == 0) {
    if (row0 < a.Tq) lse[base + row0] = l0 > 0.f ? m0 + logf(l0) : -INFINITY;
    if (row1 < a.Tq) lse[base + row1] = l1 > 0.f ? m1 + logf(l1) : -INFINITY;
  }
}

}  // namespace

bool flash_attention_supported(const AttentionArgs& a) {
  // grid.y = Hq and grid.z = B are at most 65535.
  return !a.bias && (a.D == 64 || a.D == 128) && a.Hq <= 65535 && a.B <= 65535;
}

void flash_attention_forward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                             float* o, float* lse) {
  if (a.B * a.Hq * a.Tq == 0) return;
  const dim3 grid(unsigned((a.Tq + kRows - 1) / kRows), unsigned(a.Hq), unsigned(a.B));
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  const auto* kb = static_cast<const __nv_bfloat16*>(k);
  const auto* vb = static_cast<const __nv_bfloat16*>(v);
  if (a.D == 64) {
    flash_fwd<64><<<grid, kWarps * 32, smem_bytes<64>(), stream()>>>(a, qb, kb, vb, o, lse);
  } else {
    // Per device (the attribute is the current device's), so on every launch: cheap.
    REDCO_CUDA(cudaFuncSetAttribute(flash_fwd<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem_bytes<128>()));
    flash_fwd<128><<<grid, kWarps * 32, smem_bytes<128>(), stream()>>>(a, qb, kb, vb, o, lse);
  }
  check_launch("flash attention");
}

}  // namespace redco::cuda::k
