#include "redco/ops/cpu/skinny_f32.hpp"

#include <algorithm>

#include "redco/ops/cpu/parallel.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define REDCO_SKINNY_F32_AVX2 1
#endif

namespace redco::cpu {
namespace {

#if REDCO_SKINNY_F32_AVX2
constexpr int64_t kPrefetchBytes = 4096;

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

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
    for (int64_t m = 0; m < M; m += 4) {  // rows beyond the first 4 re-read w from cache
      const float* xm = x + m * ldx;
      float* ym = y + m * ldy;
      switch (std::min<int64_t>(4, M - m)) {
        case 4:
          block<4>(xm, ldx, w, ldw, ym, ldy, n0, n1, K);
          break;
        case 3:
          block<3>(xm, ldx, w, ldw, ym, ldy, n0, n1, K);
          break;
        case 2:
          block<2>(xm, ldx, w, ldw, ym, ldy, n0, n1, K);
          break;
        default:
          block<1>(xm, ldx, w, ldw, ym, ldy, n0, n1, K);
          break;
      }
    }
  });
}

}  // namespace redco::cpu
