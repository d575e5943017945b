// Prefill against int8 rows (prefill_i8.hpp).
//
// AMX. tdpbf16ps wants its right operand in pairs of k (a 32-bit lane holds
// two consecutive k of one column); the left one is plain rows. Int8 weights
// are stored by rows, so they go left as they are (widened to bf16, 32 rows
// at a time, in L2) and the activations go right: x is rewritten once per
// call as pairs of k for every row (xv[r, m] = x[m, 2r], x[m, 2r + 1]). Each
// tile product then gives 16 outputs x 16 rows, transposed into y with the
// outputs' scales on the way.
#include "redco/ops/cpu/prefill_i8.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/core/error.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_bf16.hpp"
#include "redco/ops/cpu/skinny_i8.hpp"

#if defined(__AVX512F__) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#define REDCO_PREFILL_I8_AMX 1
#endif

namespace redco::cpu {
namespace {

[[maybe_unused]] int64_t round_up(int64_t v, int64_t to) {  // the AMX path's
  return (v + to - 1) / to * to;
}

// Weight rows a task keeps in L2 while every row of x passes (64 x 2048
// bytes for LLaMA 1.1B's projections).
constexpr int64_t kRowsKernelBlock = 64;

void rows_kernel(const float* x, int64_t ldx, const int8_t* q, int64_t ldw, const float* scale,
                 float* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
  const int64_t blocks = (N + kRowsKernelBlock - 1) / kRowsKernelBlock;
  parallel_chunks(blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t bi = b; bi < e; ++bi) {
      const int64_t n0 = bi * kRowsKernelBlock, nb = std::min(kRowsKernelBlock, N - n0);
      for (int64_t m = 0; m < M; m += kSkinnyRows)
        skinny_matmul_i8(x + m * ldx, ldx, q + n0 * ldw, ldw, scale + n0, y + m * ldy + n0, ldy,
                         std::min(kSkinnyRows, M - m), nb, K);
    }
  });
}

#if REDCO_PREFILL_I8_AMX
constexpr int64_t kBlock = 32;  // outputs and rows of a tile block; k per tile row

// Same tile shapes as prefill_panels.cpp: 16 rows x 64 bytes each.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// xv [Kp / 2, ldv] 32-bit words: x rounded to bf16 in pairs of k, zero past M
// and K; ldv = Mp + 16, so a tile's 16 rows are not a power of two apart
// (2 KB strides put them in two of L1's 64 sets). The calling thread's buffer, grown once to the
// largest prefill.
const uint32_t* pairs_of_k(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t Mp,
                           int64_t Kp, int64_t ldv) {
  thread_local std::vector<uint32_t, Eigen::aligned_allocator<uint32_t>> buf;
  if (int64_t(buf.size()) < Kp / 2 * ldv) buf.resize(size_t(Kp / 2 * ldv));
  uint32_t* v = buf.data();
  parallel_chunks(Kp / 2, grain_for(int64_t{1} << 14, Mp), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t m = 0; m < Mp; ++m) {
        const int64_t k = 2 * r;
        const uint32_t lo = m < M && k < K ? float_to_bf16(x[m * ldx + k]) : 0;
        const uint32_t hi = m < M && k + 1 < K ? float_to_bf16(x[m * ldx + k + 1]) : 0;
        v[r * ldv + m] = lo | hi << 16;
      }
  });
  return v;
}

// Weight rows [n0, n0 + 32) widened to bf16 [32, ldb], zero past N and K
// (ldb = Kp + 32: rows not a power of two apart, as xv's).
// An int8 value converts to f32 exactly, and its bf16 is the f32's top half.
void widen_rows(const int8_t* q, int64_t ldw, int64_t n0, int64_t N, int64_t K, int64_t ldb,
                uint16_t* wb) {
  for (int64_t j = 0; j < kBlock; ++j) {
    uint16_t* row = wb + j * ldb;
    const int64_t n = n0 + j;
    int64_t k = 0;
    if (n < N) {
      const int8_t* src = q + n * ldw;
      for (; k + 16 <= K; k += 16) {
        const __m512i w =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)));
        const __m512i f = _mm512_castps_si512(_mm512_cvtepi32_ps(w));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + k),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(f, 16)));
      }
      for (; k < K; ++k) row[k] = float_to_bf16(float(src[k]));
    }
    std::fill(row + k, row + ldb, uint16_t{0});
  }
}

// Outputs [0, 32) of wb against rows [m0, m0 + 32) of xv into t [32 outputs][32 rows].
void amx_block(const uint16_t* wb, int64_t Kp, int64_t ldb, const uint32_t* xv, int64_t ldv,
               int64_t m0, float* t) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < Kp; k += kBlock) {
    _tile_loadd(4, wb + k, ldb * 2);
    _tile_loadd(5, wb + 16 * ldb + k, ldb * 2);
    _tile_loadd(6, xv + k / 2 * ldv + m0, ldv * 4);
    _tile_loadd(7, xv + k / 2 * ldv + m0 + 16, ldv * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, t, kBlock * 4);
  _tile_stored(1, t + 16, kBlock * 4);
  _tile_stored(2, t + 16 * kBlock, kBlock * 4);
  _tile_stored(3, t + 16 * kBlock + 16, kBlock * 4);
}

void amx_kernel(const float* x, int64_t ldx, const int8_t* q, int64_t ldw, const float* scale,
                float* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
  const int64_t Kp = round_up(K, kBlock), Mp = round_up(M, kBlock), ldv = Mp + 16, ldb = Kp + 32;
  const uint32_t* xv = pairs_of_k(x, ldx, M, K, Mp, Kp, ldv);
  const int64_t groups = (N + kBlock - 1) / kBlock;
  const int64_t grain = grain_for(int64_t{1} << 22, 2 * M * K * kBlock);
  parallel_chunks(groups, grain, [&](int64_t b, int64_t e) {
    thread_local std::vector<uint16_t, Eigen::aligned_allocator<uint16_t>> wb;
    if (int64_t(wb.size()) < kBlock * ldb) wb.resize(size_t(kBlock * ldb));
    alignas(64) float t[kBlock * kBlock];
    static const TileConfig config;
    _tile_loadconfig(&config);
    for (int64_t g = b; g < e; ++g) {
      const int64_t n0 = g * kBlock, valid = std::min(kBlock, N - n0);
      widen_rows(q, ldw, n0, N, K, ldb, wb.data());
      for (int64_t m0 = 0; m0 < Mp; m0 += kBlock) {
        amx_block(wb.data(), Kp, ldb, xv, ldv, m0, t);
        for (int64_t r = 0; r < std::min(kBlock, M - m0); ++r)
          for (int64_t j = 0; j < valid; ++j)
            y[(m0 + r) * ldy + n0 + j] = t[j * kBlock + r] * scale[n0 + j];
      }
    }
    _tile_release();
  });
}
#endif

}  // namespace

void prefill_matmul_i8(const float* x, int64_t ldx, const int8_t* q, int64_t ldw,
                       const float* scale, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                       PrefillUnit unit) {
  REDCO_CHECK(unit == PrefillUnit::none ||
                  (unit == PrefillUnit::amx && best_prefill_unit() == PrefillUnit::amx),
              "prefill_matmul_i8: the unit must be none (any CPU) or amx (on a CPU with AMX)");
  if (M == 0 || N == 0) return;
#if REDCO_PREFILL_I8_AMX
  if (unit == PrefillUnit::amx) return amx_kernel(x, ldx, q, ldw, scale, y, ldy, M, N, K);
#endif
  rows_kernel(x, ldx, q, ldw, scale, y, ldy, M, N, K);
}

}  // namespace redco::cpu
