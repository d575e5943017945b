#include "redco/ops/cpu/skinny_i8.hpp"

#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_blocks.hpp"

namespace redco::cpu {
namespace {
using skinny::for_row_blocks;

#if REDCO_SKINNY_AVX2
using skinny::hsum;
using skinny::kPrefetchBytes;

// 8 int8 weights (an 8-byte load) widened to f32 lanes.
inline __m256 widen8(const int8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

// Weight rows [n0, n1) against MB activation rows: two accumulators per row
// (the first and second 8 of each 16 weights), as the f32 and bf16 kernels.
template <int MB>
void block(const float* x, int64_t ldx, const int8_t* q, int64_t ldw, const float* scale, float* y,
           int64_t ldy, int64_t n0, int64_t n1, int64_t K) {
  const int64_t K16 = K / 16 * 16;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* wr = q + n * ldw;
    __m256 acc[MB][2];
    for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K16; k += 16) {
      if (k % 64 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(wr + k) + kPrefetchBytes, _MM_HINT_T0);
      const __m256 w0 = widen8(wr + k), w1 = widen8(wr + k + 8);
      for (int r = 0; r < MB; ++r) {
        acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + k), acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + k + 8), acc[r][1]);
      }
    }
    for (int r = 0; r < MB; ++r) {
      float s = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
      for (int64_t t = K16; t < K; ++t) s += x[r * ldx + t] * float(wr[t]);
      y[r * ldy + n] = s * scale[n];
    }
  }
}
#else
template <int MB>
void block(const float* x, int64_t ldx, const int8_t* q, int64_t ldw, const float* scale, float* y,
           int64_t ldy, int64_t n0, int64_t n1, int64_t K) {
  for (int64_t n = n0; n < n1; ++n)
    for (int r = 0; r < MB; ++r) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[r * ldx + k] * float(q[n * ldw + k]);
      y[r * ldy + n] = s * scale[n];
    }
}
#endif

}  // namespace

void skinny_matmul_i8(const float* x, int64_t ldx, const int8_t* q, int64_t ldw, const float* scale,
                      float* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
  // Tasks over weight rows of ~64 KB each, so both threads stream the matrix.
  const int64_t grain = grain_for(int64_t(1) << 16, K);
  parallel_chunks(N, grain, [&](int64_t n0, int64_t n1) {
    for_row_blocks(M, [&]<int MB>(int64_t m) {
      block<MB>(x + m * ldx, ldx, q, ldw, scale, y + m * ldy, ldy, n0, n1, K);
    });
  });
}

}  // namespace redco::cpu
