#include "redco/ops/cpu/skinny_f32.hpp"

#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_blocks.hpp"

namespace redco::cpu {

void skinny_matmul_f32(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                       int64_t ldy, int64_t M, int64_t N, int64_t K) {
#if REDCO_SKINNY_AVX2
  const auto load8 = [](const float* p) { return _mm256_loadu_ps(p); };
#else
  const auto load8 = [](const float*) { return 0; };
#endif
  const auto unscaled = [](int64_t) { return 1.f; };  // x 1 is exact: plain f32 sums
  // Tasks over weight rows of ~64 KB each, so both threads stream the matrix.
  const int64_t grain = grain_for(int64_t(1) << 14, K);
  parallel_chunks(N, grain, [&](int64_t n0, int64_t n1) {
    skinny::for_chunks(M, n0, n1, K, [&]<int MB>(int64_t m, const skinny::KChunk& c, float* carry) {
      skinny::rows_block<MB>(x + m * ldx, ldx, w, ldw, y + m * ldy, ldy, n0, n1, K, c, carry, load8,
                             unscaled);
    });
  });
}

}  // namespace redco::cpu
