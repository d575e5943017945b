#pragma once
// What the skinny decode kernels (skinny_f32.cpp, skinny_bf16.cpp) share:
// how they cut a product into register blocks, and a horizontal sum.
//
// A block is MB activation rows against one weight row at a time, two
// accumulators per output (two FMA chains in flight per output: one chain
// alone is latency-bound at one row; measured, keeping more weight rows in
// flight instead gained 8-17% at 8 rows and lost 5-20% at one). Every output
// is summed in the same order (each accumulator over k, the two added, the
// lanes, then the tail) whatever MB is, so a sequence's logits do not depend
// on the batch it is decoded in, bit for bit.
#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define REDCO_SKINNY_AVX2 1
#endif

namespace redco::cpu::skinny {

// Calls f.template operator()<MB>(m) for row blocks m, m + MB, ... of M rows:
// up to 4 rows a pass (rows past the first 4 read the weights again, from
// cache: 4 x 2 accumulators and the weights fill the 16 registers).
template <typename F>
void for_row_blocks(int64_t M, const F& f) {
  for (int64_t m = 0; m < M; m += 4) switch (std::min<int64_t>(4, M - m)) {
      case 4:
        f.template operator()<4>(m);
        break;
      case 3:
        f.template operator()<3>(m);
        break;
      case 2:
        f.template operator()<2>(m);
        break;
      default:
        f.template operator()<1>(m);
        break;
    }
}

#if REDCO_SKINNY_AVX2
// The hardware prefetcher alone leaves the weight stream short of bandwidth.
constexpr int64_t kPrefetchBytes = 4096;

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif

}  // namespace redco::cpu::skinny
