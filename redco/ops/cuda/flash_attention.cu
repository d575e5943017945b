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
// kernels). The backward stays the GEMM path's, which recomputes P from lse.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments"), g = lane / 4,
// t = lane % 4: A (16x16, row-major) regs {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..),
// (g+8, 2t+8..)}; B (16x8, k x n) regs {(k 2t..2t+1, n g), (k 2t+8.., n g)};
// C (16x8) {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}. Two C tiles of S side
// by side are exactly one A fragment of P for the P V product.
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "redco/ops/cuda/attention_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

constexpr int kRows = 64;  // query rows a block, 16 per warp
constexpr int kKeys = 64;  // keys a tile
constexpr int kWarps = 4;

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pair(const __nv_bfloat16* p) {  // p[0], p[1]
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t two(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}

// rows [r0, r0 + n) of a [rows_total, D] bf16 matrix into shared memory of
// row pitch P (elements), zeros past rows_total; 16-byte loads (D % 8 == 0).
template <int D, int P>
__device__ void load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t r0,
                          int64_t rows_total, int n) {
  constexpr int kVecs = D / 8;  // 16-byte vectors a row
  for (int i = threadIdx.x; i < n * kVecs; i += blockDim.x) {
    const int r = i / kVecs, c = (i % kVecs) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < rows_total) v = *reinterpret_cast<const uint4*>(src + (r0 + r) * D + c);
    *reinterpret_cast<uint4*>(dst + r * P + c) = v;
  }
}

struct RowRange {
  int64_t lo, hi;  // visible keys [lo, hi)
};
__device__ RowRange visible(const AttentionArgs& a, int64_t b, int64_t i) {
  const int64_t begin = a.key_begin ? a.key_begin[b] : 0;
  const int64_t end = a.key_end ? a.key_end[b] : a.Tk;
  int64_t hi = end;
  if (a.causal) {
    const int64_t off = a.causal_offset ? a.causal_offset[b] : a.Tk - a.Tq;
    int64_t c = i + off + 1;
    c = c < 0 ? 0 : (c > a.Tk ? a.Tk : c);
    hi = hi < c ? hi : c;
  }
  return {begin, hi > begin ? hi : begin};
}

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
  for (int s = 0; s < D / 16; ++s) {
    const __nv_bfloat16* r0p = qs + (warp * 16 + g) * P + s * 16 + 2 * t;
    const __nv_bfloat16* r1p = r0p + 8 * P;
    qf[s][0] = pair(r0p), qf[s][1] = pair(r1p), qf[s][2] = pair(r0p + 8), qf[s][3] = pair(r1p + 8);
  }
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
        const __nv_bfloat16* kp = ks + (n * 8 + g) * P + kk * 16 + 2 * t;
        mma(s[n], qf[kk], pair(kp), pair(kp + 8));
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
      pf[n / 2][(n % 2) * 2 + 0] = pack(p0, p1);
      pf[n / 2][(n % 2) * 2 + 1] = pack(p2, p3);
    }
    for (int d = 0; d < D / 8; ++d)
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const __nv_bfloat16* vp = vs + (kk * 16 + 2 * t) * P + d * 8 + g;
        mma(acc[d], pf[kk], two(vp[0], vp[P]), two(vp[8 * P], vp[9 * P]));
      }
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
