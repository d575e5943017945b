#include "redco/ops/cpu/skinny_i8.hpp"

#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_blocks.hpp"

namespace redco::cpu {

void skinny_matmul_i8(const float* x, int64_t ldx, const int8_t* q, int64_t ldw, const float* scale,
                      float* y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
#if REDCO_SKINNY_AVX2
  const auto load8 = [](const int8_t* p) {  // 8 int8 (an 8-byte load) widened to f32 lanes
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  };
#else
  const auto load8 = [](const int8_t*) { return 0; };
#endif
  const auto row_scale = [scale](int64_t n) { return scale[n]; };
  // Tasks over weight rows of ~64 KB each, so both threads stream the matrix.
  const int64_t grain = grain_for(int64_t(1) << 16, K);
  parallel_chunks(N, grain, [&](int64_t n0, int64_t n1) {
    skinny::for_chunks(M, n0, n1, K, [&]<int MB>(int64_t m, const skinny::KChunk& c, float* carry) {
      skinny::rows_block<MB>(x + m * ldx, ldx, q, ldw, y + m * ldy, ldy, n0, n1, K, c, carry, load8,
                             row_scale);
    });
  });
}

}  // namespace redco::cpu
