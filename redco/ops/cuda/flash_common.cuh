#pragma once
// What the flash attention kernels share (flash_attention.cu, the forward;
// flash_attention_bwd.cu, the backward): the bf16 tensor-core product
// mma.sync m16n8k16 and its fragments, tile loads into shared memory, and
// which keys a query sees.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
// point type"), g = lane / 4, t = lane % 4, the lower-indexed element of a pair
// in the low 16 bits: A (16x16, row-major) regs {(g, 2t..2t+1), (g+8, 2t..),
// (g, 2t+8..), (g+8, 2t+8..)}; B (16x8, k x n) regs {(k 2t..2t+1, n g),
// (k 2t+8.., n g)}; C (16x8) {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
// Two C tiles side by side are exactly one A fragment (P from S).
#include <cuda_bf16.h>

#include <cstdint>

#include "redco/ops/cuda/attention_cuda.hpp"

namespace redco::cuda::k::flash {

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
__device__ inline RowRange visible(const AttentionArgs& a, int64_t b, int64_t i) {
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

// A fragment of rows [r, r + 16) and columns [c, c + 16) of a shared tile of
// row pitch P (row-major, the rows the product's rows).
__device__ __forceinline__ void a_frag(uint32_t (&f)[4], const __nv_bfloat16* tile, int P, int r,
                                       int c) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const __nv_bfloat16* p0 = tile + (r + g) * P + c + 2 * t;
  const __nv_bfloat16* p1 = p0 + 8 * P;
  f[0] = pair(p0), f[1] = pair(p1), f[2] = pair(p0 + 8), f[3] = pair(p1 + 8);
}
// B fragment (k x n = 16 x 8) whose column n is the tile's row n0 + n and whose
// k runs along that row from c: B = T^T (S = Q K^T reads K so).
__device__ __forceinline__ void b_from_rows(uint32_t& b0, uint32_t& b1, const __nv_bfloat16* tile,
                                            int P, int n0, int c) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const __nv_bfloat16* p = tile + (n0 + g) * P + c + 2 * t;
  b0 = pair(p), b1 = pair(p + 8);
}
// B fragment whose k runs down the tile's rows from r0 and n along columns
// from c0: B = T (P V reads V so).
__device__ __forceinline__ void b_from_cols(uint32_t& b0, uint32_t& b1, const __nv_bfloat16* tile,
                                            int P, int r0, int c0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const __nv_bfloat16* p = tile + (r0 + 2 * t) * P + c0 + g;
  b0 = two(p[0], p[P]), b1 = two(p[8 * P], p[9 * P]);
}

// C tile n of a row of C tiles (16 x 8 each, four values per lane) as its half
// of A fragment n / 2 (16 x 16): two C tiles side by side are one A fragment.
template <int KT>
__device__ __forceinline__ void c_to_a(uint32_t (&f)[KT][4], int n, float c0, float c1, float c2,
                                       float c3) {
  f[n / 2][(n % 2) * 2 + 0] = pack(c0, c1);
  f[n / 2][(n % 2) * 2 + 1] = pack(c2, c3);
}

// acc[d] += f (16 x 16 KT) times the tile's rows [0, 16 KT), columns [8 d, 8 d + 8).
template <int KT, int DT>
__device__ __forceinline__ void against_cols(float (&acc)[DT][4], const uint32_t (&f)[KT][4],
                                             const __nv_bfloat16* tile, int P) {
  for (int d = 0; d < DT; ++d)
    for (int kk = 0; kk < KT; ++kk) {
      uint32_t b0, b1;
      b_from_cols(b0, b1, tile, P, kk * 16, d * 8);
      mma(acc[d], f[kk], b0, b1);
    }
}

}  // namespace redco::cuda::k::flash
