#include "redco/ops/cpu/skinny_bf16.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_blocks.hpp"

namespace redco::cpu {
namespace {

#if REDCO_SKINNY_AVX512
// 16 bf16 widen in order (skinny::widen16), x is read as it is; the lanes
// come out as the AVX2 kernel's even and odd accumulators, bit for bit.
template <int MB>
void block(const float*, int64_t, const float* x, int64_t ldx, const uint16_t* w, int64_t ldw,
           float* y, int64_t ldy, int64_t n0, int64_t n1, int64_t K, const skinny::KChunk& c,
           float* carry) {
  const __m512i even_then_odd =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  skinny::rows_block_512<MB>(
      x, ldx, w, ldw, y, ldy, n0, n1, K, c, carry, [](int64_t) { return 1.f; },
      [&](__m512 v) { return _mm512_permutexvar_ps(even_then_odd, v); });
}
void split_rows(const float*, int64_t, int64_t, int64_t, AlignedFloats&) {}
#elif REDCO_SKINNY_AVX2
using skinny::hsum;

// 16 bf16 loaded as 8 32-bit lanes: the odd elements already sit in the high
// halves (an AND makes them f32), the even ones need a shift. No shuffle, so
// the widening stays off the one shuffle port; x is split into even and odd
// elements once per call to match (split_rows). One K chunk of weight rows
// [n0, n1) against MB rows (skinny_blocks.hpp).
template <int MB>
void block(const float* xs, int64_t ldxs, const float* x, int64_t ldx, const uint16_t* w,
           int64_t ldw, float* y, int64_t ldy, int64_t n0, int64_t n1, int64_t K,
           const skinny::KChunk& c, float* carry) {
  const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
  const int64_t K16 = K / 16 * 16, ahead = skinny::prefetch_ahead(c, ldw, 2);
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* wr = w + n * ldw;
    float* cn = carry + (n - n0) * MB * 16;
    __m256 acc[MB][2];
    skinny::load_carry<MB>(acc, c, cn);
    for (int64_t k = c.k0; k < c.k1; k += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(wr + ahead + k), _MM_HINT_T0);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + k));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(v, high));
      for (int r = 0; r < MB; ++r) {
        acc[r][0] = _mm256_fmadd_ps(even, _mm256_loadu_ps(xs + r * ldxs + k), acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(odd, _mm256_loadu_ps(xs + r * ldxs + k + 8), acc[r][1]);
      }
    }
    if (!c.last) {
      skinny::store_carry<MB>(acc, cn);
      continue;
    }
    for (int r = 0; r < MB; ++r) {
      float s = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
      for (int64_t t = K16; t < K; ++t) s = std::fma(x[r * ldx + t], bf16_to_float(wr[t]), s);
      y[r * ldy + n] = s;
    }
  }
}

// Each row of x with every 16 elements reordered as 8 even then 8 odd:
// xs [M, K16] (the tail past the last whole 16 is read from x itself).
void split_rows(const float* x, int64_t ldx, int64_t M, int64_t K, AlignedFloats& xs) {
  const int64_t K16 = K / 16 * 16;
  xs.resize(size_t(std::max<int64_t>(M * K16, 1)));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K16; k += 16)
      for (int j = 0; j < 8; ++j) {
        xs[size_t(m * K16 + k + j)] = x[m * ldx + k + 2 * j];
        xs[size_t(m * K16 + k + 8 + j)] = x[m * ldx + k + 2 * j + 1];
      }
}
#else
template <int MB>
void block(const float*, int64_t, const float* x, int64_t ldx, const uint16_t* w, int64_t ldw,
           float* y, int64_t ldy, int64_t n0, int64_t n1, int64_t K, const skinny::KChunk& c,
           float*) {
  if (!c.last) return;  // one pass over all of K at the last chunk
  for (int64_t n = n0; n < n1; ++n)
    for (int r = 0; r < MB; ++r) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[r * ldx + k] * bf16_to_float(w[n * ldw + k]);
      y[r * ldy + n] = s;
    }
}
void split_rows(const float*, int64_t, int64_t, int64_t, AlignedFloats&) {}
#endif

}  // namespace

void skinny_matmul_bf16(const float* x, int64_t ldx, const uint16_t* w, int64_t ldw, float* y,
                        int64_t ldy, int64_t M, int64_t N, int64_t K) {
  // Reused (a decoded token allocates nothing) and aligned: a load that
  // straddles two cache lines costs two, and the kernel loads x for every FMA.
  thread_local AlignedFloats xs;
  split_rows(x, ldx, M, K, xs);
  // A pointer, not the name: inside the tasks `xs` would be each worker's own.
  const float* xs_data = xs.data();
#if REDCO_SKINNY_AVX512
  const int64_t ldxs = 0;  // x is read as it is (no split rows)
#else
  const int64_t ldxs = K / 16 * 16;
#endif
  // Tasks over weight rows of ~64 KB each, so both threads stream the matrix.
  const int64_t grain = grain_for(int64_t(1) << 15, K);
  parallel_chunks(N, grain, [&](int64_t n0, int64_t n1) {
    skinny::for_chunks(M, n0, n1, K, [&]<int MB>(int64_t m, const skinny::KChunk& c, float* carry) {
      block<MB>(xs_data + m * ldxs, ldxs, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy, n0, n1, K, c,
                carry);
    });
  });
}

}  // namespace redco::cpu
