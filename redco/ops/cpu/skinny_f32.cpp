#include "redco/ops/cpu/skinny_f32.hpp"

#include <algorithm>

#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_blocks.hpp"

namespace redco::cpu {
namespace {
using skinny::for_row_blocks;

#if REDCO_SKINNY_AVX2
using skinny::hsum;
using skinny::kPrefetchBytes;

// Weight rows [n0, n1) against MB activation rows: two accumulators per row
// (16 floats a step) keep two FMA chains in flight per loaded weight vector.
template <int MB>
void block(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
           int64_t n0, int64_t n1, int64_t K) {
  const int64_t K16 = K / 16 * 16;
  for (int64_t n = n0; n < n1; ++n) {
    const float* wr = w + n * ldw;
    __m256 acc[MB][2];
    for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K16; k += 16) {
      // The hardware prefetcher alone leaves the stream short of bandwidth.
      _mm_prefetch(reinterpret_cast<const char*>(wr + k) + kPrefetchBytes, _MM_HINT_T0);
      const __m256 w0 = _mm256_loadu_ps(wr + k), w1 = _mm256_loadu_ps(wr + k + 8);
      for (int r = 0; r < MB; ++r) {
        acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + k), acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + k + 8), acc[r][1]);
      }
    }
    for (int r = 0; r < MB; ++r) {
      float s = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
      for (int64_t t = K16; t < K; ++t) s += x[r * ldx + t] * wr[t];
      y[r * ldy + n] = s;
    }
  }
}
#else
template <int MB>
void block(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
           int64_t n0, int64_t n1, int64_t K) {
  for (int64_t n = n0; n < n1; ++n)
    for (int r = 0; r < MB; ++r) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[r * ldx + k] * w[n * ldw + k];
      y[r * ldy + n] = s;
    }
}
#endif

}  // namespace

void skinny_matmul_f32(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                       int64_t ldy, int64_t M, int64_t N, int64_t K) {
  // Tasks over weight rows of ~64 KB each, so both threads stream the matrix.
  const int64_t grain = grain_for(int64_t(1) << 14, K);
  parallel_chunks(N, grain, [&](int64_t n0, int64_t n1) {
    for_row_blocks(M, [&]<int MB>(int64_t m) {
      block<MB>(x + m * ldx, ldx, w, ldw, y + m * ldy, ldy, n0, n1, K);
    });
  });
}

}  // namespace redco::cpu
