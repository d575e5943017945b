#include "redco/ops/cpu/skinny_i8_panels.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "redco/ops/cpu/panel_layout.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_blocks.hpp"

namespace redco::cpu {
namespace {

using panels::i8::kRows;  // 64 outputs a panel, one cache line a column

#if REDCO_SKINNY_AVX512
// NP panels side by side (outputs [n0, n0 + NP * 64)) against MB rows of x.
// Per column k: each panel's line widened to 4 x 16 f32 lanes, one broadcast
// of x[r, k] per row, 4 * NP FMAs per row. Two panels read two streams at
// once: LLaMA 1.1B's projections on 2 threads, 32-35 GB/s at 1-3 rows
// against 25-29 for one panel at a time (bench_int8_decode; bf16 panels: 31-32).
template <int MB, int NP>
void panel_block(const float* x, int64_t ldx, const int8_t* p, int64_t K, const float* scale,
                 float* y, int64_t ldy, int64_t n0, int64_t valid) {
  constexpr int V = 4 * NP;  // accumulators a row: 16 outputs each
  __m512 acc[MB][V];
  for (int r = 0; r < MB; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  // The hardware prefetcher follows each stream; this keeps them 2 KB ahead.
  constexpr int64_t kAhead = 32;  // columns
  for (int64_t k = 0; k < K; ++k) {
    __m512 xb[MB];
    for (int r = 0; r < MB; ++r) xb[r] = _mm512_set1_ps(x[r * ldx + k]);
    // Each 16 weights widened just before their FMAs: one weight register
    // live, so two panels fit 3 rows (24 accumulators, 3 broadcasts).
    for (int j = 0; j < NP; ++j) {
      const int8_t* line = p + (j * K + k) * kRows;
      _mm_prefetch(reinterpret_cast<const char*>(line + kAhead * kRows), _MM_HINT_T0);
      for (int q = 0; q < 4; ++q) {
        const __m512 w = skinny::widen16(line + 16 * q);
        for (int r = 0; r < MB; ++r)
          acc[r][4 * j + q] = _mm512_fmadd_ps(w, xb[r], acc[r][4 * j + q]);
      }
    }
  }
  for (int v = 0; v < V; ++v) {
    const int64_t left = std::clamp<int64_t>(valid - 16 * v, 0, 16);
    if (left == 0) break;
    const __mmask16 m = __mmask16((1u << left) - 1u);
    const __m512 s = _mm512_maskz_loadu_ps(m, scale + n0 + 16 * v);
    for (int r = 0; r < MB; ++r)
      _mm512_mask_storeu_ps(y + r * ldy + n0 + 16 * v, m, _mm512_mul_ps(acc[r][v], s));
  }
}
#else
// Any CPU: the same chains, one output at a time (the same bits).
template <int MB, int NP>
void panel_block(const float* x, int64_t ldx, const int8_t* p, int64_t K, const float* scale,
                 float* y, int64_t ldy, int64_t n0, int64_t valid) {
  for (int r = 0; r < MB; ++r)
    for (int64_t i = 0; i < valid; ++i) {
      const int8_t* panel = p + i / kRows * K * kRows;
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k)
        acc = std::fma(float(panel[k * kRows + i % kRows]), x[r * ldx + k], acc);
      y[r * ldy + n0 + i] = acc * scale[n0 + i];
    }
}
#endif

// Rows a block: one panel and 6 rows is 24 accumulators, 6 broadcasts and a
// weight vector of AVX-512's 32 registers; two panels take up to 3 rows.
constexpr int kBlockRows = 6;

using Block = void (*)(const float*, int64_t, const int8_t*, int64_t, const float*, float*, int64_t,
                       int64_t, int64_t);
template <size_t... I>
constexpr std::array<Block, sizeof...(I)> one_panel(std::index_sequence<I...>) {
  return {&panel_block<int(I) + 1, 1>...};
}
constexpr auto kOnePanel = one_panel(std::make_index_sequence<kBlockRows>{});
constexpr int kTwoPanelRows = 3;

constexpr std::array<Block, kTwoPanelRows> kTwoPanels = {&panel_block<1, 2>, &panel_block<2, 2>,
                                                         &panel_block<3, 2>};

}  // namespace

void skinny_matmul_i8_panels(const float* x, int64_t ldx, const int8_t* packed, const float* scale,
                             float* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
  const int64_t n_panels = panels::i8::padded_rows(N) / kRows;
  // Up to 3 rows read two panels at a time; tasks are whole pairs (K * 128
  // bytes or more), so both threads stream the matrix. More rows read one
  // panel for up to 6 rows: two panels in blocks of 3 would read each pair
  // again from L2, slower at 4 to 8 rows than one stream read once.
  const int64_t step = M <= kTwoPanelRows ? 2 : 1;
  const int64_t units = (n_panels + step - 1) / step;
  const int64_t grain = grain_for(int64_t(1) << 16, K * kRows * step);
  parallel_chunks(units, grain, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      const int64_t first = u * step, count = std::min(step, n_panels - first);
      const int8_t* p = packed + first * K * kRows;
      const int64_t n0 = first * kRows, valid = std::min(count * kRows, N - n0);
      // Rows past the first block read the panels again, from L2.
      const int64_t block = count == 2 ? kTwoPanelRows : kBlockRows;
      for (int64_t m = 0; m < M; m += block) {
        const int64_t rows = std::min<int64_t>(block, M - m);
        const Block f = count == 2 ? kTwoPanels[size_t(rows - 1)] : kOnePanel[size_t(rows - 1)];
        f(x + m * ldx, ldx, p, K, scale, y + m * ldy, ldy, n0, valid);
      }
    }
  });
}

}  // namespace redco::cpu
