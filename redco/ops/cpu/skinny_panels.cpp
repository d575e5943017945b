#include "redco/ops/cpu/skinny_panels.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "redco/core/dtype.hpp"
#include "redco/ops/cpu/panel_layout.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_blocks.hpp"

namespace redco::cpu {
namespace {

using panels::kRows;

#if REDCO_SKINNY_AVX512
// One panel (outputs [n0, n0 + valid)) against MB rows of x. Per column k:
// one 64-byte load widened to outputs 0-15 (shift) and 16-31 (AND), one
// broadcast of x[r, k] per row, two FMAs per row. MB <= 8: 16 accumulators,
// 16 chains in flight.
template <int MB>
void panel_block(const float* x, int64_t ldx, const uint16_t* p, int64_t K, float* y, int64_t ldy,
                 int64_t n0, int64_t valid) {
  const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
  __m512 lo[MB], hi[MB];  // [MB] x outputs 0-15 and 16-31 of the panel
  for (int r = 0; r < MB; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  // A column is one cache line: the prefetcher follows the stream, this keeps
  // it ahead when the FMAs are the bottleneck (a batch of 8).
  constexpr int64_t kAhead = 32;  // columns
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(p + (k + kAhead) * kRows), _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(p + k * kRows);
    const __m512 w_lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    const __m512 w_hi = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    for (int r = 0; r < MB; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * ldx + k]);
      lo[r] = _mm512_fmadd_ps(w_lo, xb, lo[r]);
      hi[r] = _mm512_fmadd_ps(w_hi, xb, hi[r]);
    }
  }
  const __mmask16 m_lo = __mmask16((1u << std::min<int64_t>(valid, 16)) - 1u);
  const __mmask16 m_hi = __mmask16((1u << std::clamp<int64_t>(valid - 16, 0, 16)) - 1u);
  for (int r = 0; r < MB; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy + n0, m_lo, lo[r]);
    _mm512_mask_storeu_ps(y + r * ldy + n0 + 16, m_hi, hi[r]);
  }
}
#else
// Any CPU: the same chains, one output at a time (the same bits).
template <int MB>
void panel_block(const float* x, int64_t ldx, const uint16_t* p, int64_t K, float* y, int64_t ldy,
                 int64_t n0, int64_t valid) {
  for (int r = 0; r < MB; ++r)
    for (int64_t i = 0; i < valid; ++i) {
      const int64_t s = panels::slot(i);
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k)
        acc = std::fma(bf16_to_float(p[k * kRows + s]), x[r * ldx + k], acc);
      y[r * ldy + n0 + i] = acc;
    }
}
#endif

constexpr int kBlockRows = 8;

// panel_block<MB> for MB = 1 .. kBlockRows, indexed by MB - 1.
using Block = void (*)(const float*, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t,
                       int64_t);
template <size_t... I>
constexpr std::array<Block, sizeof...(I)> blocks(std::index_sequence<I...>) {
  return {&panel_block<int(I) + 1>...};
}
constexpr auto kBlocks = blocks(std::make_index_sequence<kBlockRows>{});

}  // namespace

void skinny_matmul_panels(const float* x, int64_t ldx, const uint16_t* packed, float* y,
                          int64_t ldy, int64_t M, int64_t N, int64_t K) {
  const int64_t n_panels = panels::padded_rows(N) / kRows;
  // Tasks of a panel or more (K * 64 bytes each), so both threads stream the matrix.
  const int64_t grain = grain_for(int64_t(1) << 16, K * kRows * 2);
  parallel_chunks(n_panels, grain, [&](int64_t b, int64_t e) {
    for (int64_t pi = b; pi < e; ++pi) {
      const uint16_t* p = packed + pi * K * kRows;
      const int64_t n0 = pi * kRows, valid = std::min(kRows, N - n0);
      // Rows past the first 8 read the panel again, from L2.
      for (int64_t m = 0; m < M; m += kBlockRows) {
        const float* xm = x + m * ldx;
        float* ym = y + m * ldy;
        kBlocks[size_t(std::min<int64_t>(kBlockRows, M - m) - 1)](xm, ldx, p, K, ym, ldy, n0,
                                                                  valid);
      }
    }
  });
}

bool panels_pay() {
#if REDCO_SKINNY_AVX512
  return true;
#else
  return false;
#endif
}

}  // namespace redco::cpu
