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
#include <cmath>
#include <cstdint>
#include <vector>

#include "redco/core/dtype.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define REDCO_SKINNY_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define REDCO_SKINNY_AVX512 1
#endif
#endif

namespace redco::cpu::skinny {

// Rows a pass: AVX2 has 16 vector registers, which 4 rows x 2 accumulators and
// the weights fill; rows past the first 4 read the weights again (from cache)
// and widen them again. AVX-512 has 32, so a batch of 8 streams and widens
// the weights once (rows_block_512).
#if REDCO_SKINNY_AVX512
constexpr int64_t kPassRows = 8;
#else
constexpr int64_t kPassRows = 4;
#endif

// Calls f.template operator()<MB>(m) for row blocks m, m + MB, ... of M rows,
// up to kPassRows rows a block.
template <typename F>
void for_row_blocks(int64_t M, const F& f) {
  for (int64_t m = 0; m < M; m += kPassRows) switch (std::min<int64_t>(kPassRows, M - m)) {
      case 8:
        if constexpr (kPassRows >= 8) f.template operator()<8>(m);
        break;
      case 7:
        if constexpr (kPassRows >= 8) f.template operator()<7>(m);
        break;
      case 6:
        if constexpr (kPassRows >= 8) f.template operator()<6>(m);
        break;
      case 5:
        if constexpr (kPassRows >= 8) f.template operator()<5>(m);
        break;
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

// Every FMA loads an activation, so the row block's activations must stay in
// L1 while the weights stream past: K is walked in chunks of kChunk (8 rows x
// 512 f32 = 16 KB). Whole rows did not fit: the bf16 kernel at 8 rows, weights
// in cache, ran 65 and 57 GFLOP/s at K 2048 and 5632 against 90 at 768. Between chunks each
// output's two accumulators wait in `carry` exactly as they were in registers, so the summation
// order, and every result bit, is the chunk size's business no more than the batch's.
constexpr int64_t kChunk = 512;

// A K chunk [k0, k1) of a pass; the last one (k1 == K16) also adds the tail.
struct KChunk {
  int64_t k0, k1;
  bool first, last;
};

// Calls f.template operator()<MB>(m, chunk, carry) over the K chunks and,
// within each, the row blocks of M rows, against weight rows [n0, n1).
// carry: per row block, [n1 - n0, MB, 2, 8] partial sums (grows once per thread).
template <typename F>
void for_chunks(int64_t M, int64_t n0, int64_t n1, int64_t K, const F& f) {
  thread_local std::vector<float> carry;  // 32-byte loads and stores at any alignment
  carry.resize(size_t(M * (n1 - n0) * 16));
  // Up to 4 rows walk whole rows: their activations are loaded once per weight
  // vector anyway, and whole rows keep the weight stream straight.
  const int64_t K16 = K / 16 * 16, chunk = M > 4 ? kChunk : std::max<int64_t>(K16, 1);
  for (int64_t k0 = 0;; k0 += chunk) {
    const KChunk c{k0, std::min(K16, k0 + chunk), k0 == 0, k0 + chunk >= K16};
    for_row_blocks(M, [&]<int MB>(int64_t m) {
      f.template operator()<MB>(m, c, carry.data() + m * (n1 - n0) * 16);
    });
    if (c.last) return;
  }
}

#if REDCO_SKINNY_AVX2
constexpr int64_t kPrefetchBytes = 4096;

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif

#if REDCO_SKINNY_AVX2
// The hardware prefetcher alone leaves the weight stream short of bandwidth:
// the weights kPrefetchBytes on in the order the chunks read them (straight on
// when one chunk spans the rows, else the same chunk of a row further down).
inline int64_t prefetch_ahead(const KChunk& c, int64_t ldw, int64_t elem_bytes) {
  if (c.first && c.last) return kPrefetchBytes / elem_bytes;
  return std::max<int64_t>(1, kPrefetchBytes / ((c.k1 - c.k0) * elem_bytes)) * ldw;
}

// A pass's accumulators: zero at its first chunk, else as the last chunk left them.
template <int MB>
inline void load_carry(__m256 (&acc)[MB][2], const KChunk& c, const float* carry) {
  for (int r = 0; r < MB; ++r)
    for (int h = 0; h < 2; ++h)
      acc[r][h] = c.first ? _mm256_setzero_ps() : _mm256_loadu_ps(carry + (2 * r + h) * 8);
}
template <int MB>
inline void store_carry(const __m256 (&acc)[MB][2], float* carry) {
  for (int r = 0; r < MB; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(carry + (2 * r + h) * 8, acc[r][h]);
}
#endif

// Weight rows [n0, n1) against MB activation rows over one K chunk, for
// weights whose 8 consecutive elements widen straight to 8 f32 lanes (f32
// itself, int8); at the last chunk
//   y[r, n] = scale(n) * sum_k x[r, k] * w[n, k]
// two accumulators per row (the first and second 8 of each 16 weights) keep two
// FMA chains in flight per loaded weight vector. load8(p) widens w[p .. p + 8).
// One weight as f32 (the tails past the last whole 16).
inline float widen1(float v) { return v; }
inline float widen1(int8_t v) { return float(v); }
inline float widen1(uint16_t v) { return bf16_to_float(v); }

#if REDCO_SKINNY_AVX512
// 16 consecutive weights as f32 lanes, in order.
inline __m512 widen16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen16(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 widen16(const uint16_t* p) {  // bf16: f32's high half
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// The 8-lane kernels' result from a 16-lane accumulator: `pairs` holds their
// two accumulators side by side (lanes 0-7 and 8-15), added as they add them.
inline float hsum_pairs(__m512 pairs) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(pairs), _mm512_extractf32x8_ps(pairs, 1)));
}

// NB weight rows at once against MB activation rows: NB * MB independent FMA
// chains. With one row (a batch-1 decode) an output's FMAs wait for each
// other: int8 weights then widen and multiply 16 weights per FMA latency. NB
// rows side by side keep each output's own chain (no result bit changes);
// rows are adjacent in memory, so the stream is NB short ones, and the
// prefetch runs one group of rows ahead (`ahead` is then NB * ldw: the
// prefetch a row ahead within the group fetched lines already being read,
// and 4 rows ran slower than 1, 12.9 against 17.3 tokens/s).
template <int MB, int NB, typename W, typename Scale, typename ToPairs>
void rows_group_512(const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy,
                    int64_t n, int64_t n0, int64_t K, const KChunk& c, float* carry,
                    const Scale& scale, const ToPairs& to_pairs, int64_t ahead) {
  constexpr int64_t kLine = 64 / int64_t(sizeof(W));  // elements a cache line: a prefetch each
  const int64_t K16 = K / 16 * 16;
  float* cn = carry + (n - n0) * MB * 16;  // [NB][MB][16]
  __m512 acc[NB][MB];
  for (int j = 0; j < NB; ++j)
    for (int r = 0; r < MB; ++r)
      acc[j][r] = c.first ? _mm512_setzero_ps() : _mm512_loadu_ps(cn + (j * MB + r) * 16);
  for (int64_t k = c.k0; k < c.k1; k += 16)
    for (int j = 0; j < NB; ++j) {
      const W* wr = w + (n + j) * ldw;
      if (k % kLine == 0) _mm_prefetch(reinterpret_cast<const char*>(wr + ahead + k), _MM_HINT_T0);
      const __m512 wv = widen16(wr + k);
      for (int r = 0; r < MB; ++r)
        acc[j][r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * ldx + k), acc[j][r]);
    }
  for (int j = 0; j < NB; ++j) {
    const W* wr = w + (n + j) * ldw;
    for (int r = 0; r < MB; ++r) {
      if (!c.last) {
        _mm512_storeu_ps(cn + (j * MB + r) * 16, acc[j][r]);
        continue;
      }
      float s = hsum_pairs(to_pairs(acc[j][r]));
      for (int64_t t = K16; t < K; ++t) s = std::fma(x[r * ldx + t], widen1(wr[t]), s);
      y[r * ldy + n + j] = s * scale(n + j);
    }
  }
}

// rows_block with 16-lane FMAs: one accumulator per row and output whose lane
// i sums weight i of every 16, as lane i of the AVX2 kernel's pair of
// accumulators does (in the same order), so the results are bit for bit the
// AVX2 build's with half the instructions; `to_pairs` arranges the lanes as
// that pair (bf16's pair is even and odd elements) before the final sum. The
// carry keeps the 16 lanes as they are.
template <int MB, typename W, typename Scale, typename ToPairs>
void rows_block_512(const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy,
                    int64_t n0, int64_t n1, int64_t K, const KChunk& c, float* carry,
                    const Scale& scale, const ToPairs& to_pairs) {
  // Int8 rows against one row of x, whole rows only (one chunk), so a group's
  // rows stream together. LLaMA 1.1B int8 decode, alternating binaries: 17.7-18.1
  // -> 18.0-19.3 tokens/s with 4 rows (2: 15.5-15.9; 8: 18.0-18.8); f32 rows
  // lost 1-4% (6.26-6.57 -> 6.08-6.33) and keep one row at a time.
  constexpr int NB = MB == 1 && sizeof(W) == 1 ? 4 : 1;
  const int64_t ahead = prefetch_ahead(c, ldw, sizeof(W));
  int64_t n = n0;
  if (c.first && c.last)
    for (; n + NB <= n1; n += NB)
      rows_group_512<MB, NB>(x, ldx, w, ldw, y, ldy, n, n0, K, c, carry, scale, to_pairs,
                             NB > 1 ? NB * ldw : ahead);
  for (; n < n1; ++n)
    rows_group_512<MB, 1>(x, ldx, w, ldw, y, ldy, n, n0, K, c, carry, scale, to_pairs, ahead);
}
#endif

template <int MB, typename W, typename Load8, typename Scale>
void rows_block(const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy,
                int64_t n0, int64_t n1, int64_t K, const KChunk& c, float* carry,
                const Load8& load8, const Scale& scale) {
#if REDCO_SKINNY_AVX512
  (void)load8;
  rows_block_512<MB>(x, ldx, w, ldw, y, ldy, n0, n1, K, c, carry, scale,
                     [](__m512 v) { return v; });  // lanes 0-7 and 8-15 are the pair already
#elif REDCO_SKINNY_AVX2
  constexpr int64_t kLine = 64 / int64_t(sizeof(W));  // elements a cache line: a prefetch each
  const int64_t K16 = K / 16 * 16, ahead = prefetch_ahead(c, ldw, sizeof(W));
  for (int64_t n = n0; n < n1; ++n) {
    const W* wr = w + n * ldw;
    float* cn = carry + (n - n0) * MB * 16;
    __m256 acc[MB][2];
    load_carry<MB>(acc, c, cn);
    for (int64_t k = c.k0; k < c.k1; k += 16) {
      if (k % kLine == 0) _mm_prefetch(reinterpret_cast<const char*>(wr + ahead + k), _MM_HINT_T0);
      const __m256 w0 = load8(wr + k), w1 = load8(wr + k + 8);
      for (int r = 0; r < MB; ++r) {
        acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + k), acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + k + 8), acc[r][1]);
      }
    }
    if (!c.last) {
      store_carry<MB>(acc, cn);
      continue;
    }
    for (int r = 0; r < MB; ++r) {
      float s = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
      for (int64_t t = K16; t < K; ++t) s = std::fma(x[r * ldx + t], widen1(wr[t]), s);
      y[r * ldy + n] = s * scale(n);
    }
  }
#else
  (void)load8, (void)carry;
  if (!c.last) return;  // one pass over all of K at the last chunk
  for (int64_t n = n0; n < n1; ++n)
    for (int r = 0; r < MB; ++r) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[r * ldx + k] * float(w[n * ldw + k]);
      y[r * ldy + n] = s * scale(n);
    }
#endif
}

}  // namespace redco::cpu::skinny
