// Fused attention for decoding on the CPU: a few query rows against a KV
// cache (attention.hpp, decode_attention_forward).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define REDCO_DECODE_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define REDCO_DECODE_AVX512 1
#endif
#endif

#include "redco/core/dtype.hpp"
#include "redco/ops/cpu/attention.hpp"
#include "redco/ops/cpu/attention_keys.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco::cpu {

using namespace attention_detail;

// --------------------------------------------------------------- decoding --
//
// A decode step has one query row (or a few) per head against hundreds or
// thousands of cached keys. The tiled kernel would make two 1 x 64 x D GEMM
// calls per key tile (call overhead dominates) and a bf16 cache would first
// be widened into an f32 copy. Here each (batch row, kv head) task reads its
// keys and values once, as stored, for every query row of the heads sharing
// them: the scores into a row buffer, an exact softmax over each row's
// visible span (max first, no rescaling), then the values weighted into the
// output.

namespace {

#if REDCO_DECODE_AVX2
// 8 bf16 (a 16-byte load) widened to f32: bf16 is f32's high half.
inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return widen8(p); }
inline float hsum(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif
inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t x) { return bf16_to_float(x); }

// Keys are taken kDotKeys at a time and the task walks them in blocks of
// kKeyBlock (a block's keys and values stay in L1 while every query row of
// the kv head uses them).
constexpr int64_t kDotKeys = 8, kKeyBlock = 64;

// out[i] = q . k[i] over D for kDotKeys keys (f32, or bf16 widened in
// registers): one accumulator a key, the eight reduced together by one
// horizontal-add tree. Every key's sum has the same order whichever keys
// share its call, so a score does not depend on the batch or the key range.
#if REDCO_DECODE_AVX512
// Keys i and i + 1's 8 elements at d as one 16-lane vector (lanes 0-7, 8-15).
inline __m512 load8x2(const float* a, const float* b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}
inline __m512 load8x2(const uint16_t* a, const uint16_t* b) {
  const __m256i h = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

template <typename KV>
inline void dot_keys(const float* q, const KV* const* k, int64_t D, float* out) {
  int64_t d = 0;
#if REDCO_DECODE_AVX512
  // Two keys a 16-lane accumulator: each key's lanes sum exactly what its
  // 8-lane accumulator sums on AVX2 (same FMAs, same order), in half the
  // instructions; then the AVX2 tree.
  __m512 a2[kDotKeys / 2];
  for (auto& x : a2) x = _mm512_setzero_ps();
  for (; d + 8 <= D; d += 8) {
    const __m512 qd = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + d));
    for (int i = 0; i < kDotKeys / 2; ++i)
      a2[i] = _mm512_fmadd_ps(qd, load8x2(k[2 * i] + d, k[2 * i + 1] + d), a2[i]);
  }
  __m256 a[kDotKeys];
  for (int i = 0; i < kDotKeys / 2; ++i)
    a[2 * i] = _mm512_castps512_ps256(a2[i]), a[2 * i + 1] = _mm512_extractf32x8_ps(a2[i], 1);
#elif REDCO_DECODE_AVX2
  __m256 a[kDotKeys];
  for (auto& x : a) x = _mm256_setzero_ps();
  for (; d + 8 <= D; d += 8) {
    const __m256 qd = _mm256_loadu_ps(q + d);
    for (int i = 0; i < kDotKeys; ++i) a[i] = _mm256_fmadd_ps(qd, load8(k[i] + d), a[i]);
  }
#endif
#if REDCO_DECODE_AVX2
  const __m256 h03 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 h47 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(h03, h47, 0x20),
                                      _mm256_permute2f128_ps(h03, h47, 0x31)));
#else
  std::fill(out, out + kDotKeys, 0.f);
#endif
  for (; d < D; ++d)
    for (int i = 0; i < kDotKeys; ++i) out[i] += q[d] * to_f32(k[i][d]);
}

// The cache is read once a step, as a stream per (batch row, kv head) that
// the hardware prefetcher starts cold; prefetching kAheadKeys keys (values)
// ahead keeps it going while the arithmetic runs. Prefetches never fault, so
// the last ones may point past the cache.
constexpr int64_t kAheadKeys = 32;
template <typename KV>
inline void prefetch_rows(const KV* p, int64_t n) {
#if REDCO_DECODE_AVX2
  const char* b = reinterpret_cast<const char*>(p);
  for (int64_t i = 0; i < n * int64_t(sizeof(KV)); i += 64) _mm_prefetch(b + i, _MM_HINT_T0);
#else
  (void)p, (void)n;
#endif
}

// Where key x of a chunk lies, for prefetching kAheadKeys ahead: in the chunk
// (its first n keys at `here`), or past it in the next chunk, which a paged
// cache keeps elsewhere in its pool (null: none to fetch). Rows of slots are
// one chunk as far as the prefetcher is concerned (n unbounded).
template <typename KV>
struct Lookahead {
  const KV* here;
  int64_t n;
  const KV* next;
  int64_t D;
  const KV* at(int64_t x) const {
    return x < n ? here + x * D : next ? next + (x - n) * D : nullptr;
  }
};

// S[j] = scale * q . k_j for keys [j0, j1) of kb [Tk, D]; the last call's
// missing keys repeat the last key and are dropped. ahead: prefetch (null: no).
template <typename KV>
void scores(const float* q, const KV* kb, int64_t D, int64_t j0, int64_t j1, float scale, float* S,
            const Lookahead<KV>* ahead) {
  for (int64_t j = j0; j < j1; j += kDotKeys) {
    if (ahead)
      if (const KV* p = ahead->at(j + kAheadKeys)) prefetch_rows(p, kDotKeys * D);
    const KV* k[kDotKeys];
    for (int64_t i = 0; i < kDotKeys; ++i) k[i] = kb + std::min(j + i, j1 - 1) * D;
    float out[kDotKeys];
    dot_keys(q, k, D, out);
    for (int64_t i = 0; i < std::min(kDotKeys, j1 - j); ++i) S[j + i] = scale * out[i];
  }
}

// o[d0, d0 + 8 NV) += sum_j p[j] v_j[d0, ...) over keys [j0, j1), in key
// order, the NV vectors of o held in registers over the keys.
template <int NV, typename KV>
inline void weigh_values(const float* p, const KV* vb, int64_t D, int64_t d0, int64_t j0,
                         int64_t j1, float* o) {
#if REDCO_DECODE_AVX2
  __m256 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm256_loadu_ps(o + d0 + 8 * i);
  for (int64_t j = j0; j < j1; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const KV* vj = vb + j * D + d0;
    for (int i = 0; i < NV; ++i) acc[i] = _mm256_fmadd_ps(pj, load8(vj + 8 * i), acc[i]);
  }
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(o + d0 + 8 * i, acc[i]);
#else
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t d = d0; d < d0 + 8 * NV; ++d) o[d] += p[j] * to_f32(vb[j * D + d]);
#endif
}

// o[0, D) += sum_j p[j] v_j over keys [j0, j1) of vb [Tk, D].
#if REDCO_DECODE_AVX512
// weigh_values<NV> with 16-lane vectors: each o[d] sums the same FMAs in the
// same key order, so the bits are the AVX2 kernel's.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <int NV, typename KV>
inline void weigh_values16(const float* p, const KV* vb, int64_t D, int64_t d0, int64_t j0,
                           int64_t j1, float* o, const Lookahead<KV>* ahead) {
  __m512 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm512_loadu_ps(o + d0 + 16 * i);
  for (int64_t j = j0; j < j1; ++j) {
    if (ahead)
      if (const KV* a = ahead->at(j + kAheadKeys)) prefetch_rows(a + d0, 16 * NV);
    const __m512 pj = _mm512_set1_ps(p[j]);
    const KV* vj = vb + j * D + d0;
    for (int i = 0; i < NV; ++i) acc[i] = _mm512_fmadd_ps(pj, load16(vj + 16 * i), acc[i]);
  }
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(o + d0 + 16 * i, acc[i]);
}
#endif

template <typename KV>
void weigh_values(const float* p, const KV* vb, int64_t D, int64_t j0, int64_t j1, float* o,
                  [[maybe_unused]] const Lookahead<KV>* ahead) {  // read by the AVX-512 path only
  int64_t d = 0;
#if REDCO_DECODE_AVX512
  for (; d + 64 <= D; d += 64) weigh_values16<4>(p, vb, D, d, j0, j1, o, ahead);
#endif
  for (; d + 64 <= D; d += 64) weigh_values<8>(p, vb, D, d, j0, j1, o);
  for (; d + 8 <= D; d += 8) weigh_values<1>(p, vb, D, d, j0, j1, o);
  for (; d < D; ++d)
    for (int64_t j = j0; j < j1; ++j) o[d] += p[j] * to_f32(vb[j * D + d]);
}

// Where the keys (or values) of one (batch row, kv head) lie: contiguous
// [Tk, D] rows, or blocks of a paged cache. run(j) is key j's address and
// run_end(j) where the keys stored after it stop being consecutive.
template <typename KV>
struct KeyRows {
  const KV* base;  // contiguous: this head's [Tk, D]; paged: the pool [N, Hkv, block, D]
  const int64_t* table = nullptr;  // paged: this row's blocks
  int64_t block = 0, Hkv = 0, g = 0, D = 0;

  KeyRows(const AttentionShape& s, const KV* kv, int64_t b, int64_t g_)
      : base(kv), block(s.block), Hkv(s.Hkv), g(g_), D(s.D) {
    if (s.block_table)
      table = s.block_table + b * s.blocks_per_row;
    else
      base = kv + (b * s.Hkv + g) * s.Tk * s.D;
  }
  const KV* run(int64_t j) const {
    if (!table) return base + j * D;
    return base + ((table[j / block] * Hkv + g) * block + j % block) * D;
  }
  int64_t run_end(int64_t j) const {
    return table ? (j / block + 1) * block : std::numeric_limits<int64_t>::max();
  }
};

// The G = group x Tq query rows of one (batch row b, kv head g) task; row r
// is query r % Tq of head g * group + r / Tq. scratch: [G, ldS] scores, each
// row 64-byte aligned (ldS a whole number of cache lines): Eigen's vectorized
// sums peel to an alignment, so a row's softmax must not start at an address
// that depends on Tk (a paged cache's Tk is a whole number of blocks; at
// 16-lane packets two such row strides gave sums that differed in the last bit);
// rows: each row's index into q, o, lse; spans: each row's visible keys.
// KV: float or uint16_t (bf16). Keys are read in chunks of at most kKeyBlock
// that do not cross a block of a paged cache; each key's score and each
// value's weighing do not depend on the chunks, so a paged cache gives the
// bits of a contiguous one.
template <typename KV>
void decode_task(const AttentionShape& s, int64_t b, int64_t g, const float* q, const KV* k,
                 const KV* v, float* o, float* lse, AlignedFloats& scratch,
                 std::vector<int64_t>& rows, std::vector<Span>& spans) {
  const int64_t D = s.D, Tk = s.Tk, group = s.Hq / s.Hkv, G = group * s.Tq;
  const KeyRows<KV> keys(s, k, b, g), values(s, v, b, g);
  const int64_t ldS = (Tk + 15) / 16 * 16;
  if (scratch.size() < size_t(G * ldS)) scratch.resize(size_t(G * ldS));
  float* S = scratch.data();
  rows.resize(size_t(G));
  for (int64_t r = 0; r < G; ++r)
    rows[size_t(r)] = (b * s.Hq + g * group + r / s.Tq) * s.Tq + r % s.Tq;
  const KeyRange kr = keys_of(s, b);
  const int64_t j0 = std::clamp<int64_t>(kr.begin, 0, Tk), j1 = std::max(j0, key_end(s, kr, s.Tq));
  auto chunk_end = [&](int64_t jb) { return std::min({j1, jb + kKeyBlock, keys.run_end(jb)}); };
  // Prefetching from a chunk into the next: where it lies.
  auto ahead = [&](const KeyRows<KV>& kv, int64_t jb, int64_t je) {
    if (!kv.table)
      return Lookahead<KV>{kv.run(jb), std::numeric_limits<int64_t>::max(), nullptr, D};
    return Lookahead<KV>{kv.run(jb), je - jb, je < j1 ? kv.run(je) : nullptr, D};
  };
  for (int64_t jb = j0, je; jb < j1; jb = je) {  // scores: a chunk of keys for all G rows
    je = chunk_end(jb);
    const Lookahead<KV> la = ahead(keys, jb, je);
    for (int64_t r = 0; r < G; ++r)
      scores(q + rows[size_t(r)] * D, keys.run(jb), D, 0, je - jb, s.scale, S + r * ldS + jb,
             r == 0 ? &la : nullptr);  // the other rows find the chunk in L1
  }
  spans.assign(size_t(G), Span{0, 0});
  for (int64_t r = 0; r < G; ++r) {  // probabilities over the row's visible span
    const int64_t i = r % s.Tq, h = g * group + r / s.Tq, bh = b * s.Hq + h, row = rows[size_t(r)];
    float* srow = S + r * ldS;
    const Span sp = visible_in_tile(s, kr, i, 0, Tk);
    std::fill(o + row * D, o + row * D + D, 0.f);
    if (sp.hi == sp.lo) {  // no visible key: o = 0, lse = -inf, as the tiled kernel
      lse[row] = kNegInf;
      continue;
    }
    spans[size_t(r)] = sp;
    add_bias(s, s.bias ? s.bias + (s.bias_per_row ? bh : h) * s.Tq * Tk : nullptr, i, 0, sp, srow);
    Row p(srow + sp.lo, sp.hi - sp.lo);
    const float m = p.maxCoeff();
    p = (p - m).exp();
    const float l = p.sum();
    p *= 1.f / l;
    lse[row] = m + std::log(l);
  }
  for (int64_t jb = j0, je; jb < j1; jb = je) {  // outputs: a chunk of values for all G rows
    je = chunk_end(jb);
    const Lookahead<KV> la = ahead(values, jb, je);
    for (int64_t r = 0; r < G; ++r) {
      const Span sp = spans[size_t(r)];
      const int64_t lo = std::max(jb, sp.lo), hi = std::min(je, sp.hi);
      if (lo < hi)
        weigh_values(S + r * ldS + jb, values.run(jb), D, lo - jb, hi - jb, o + rows[size_t(r)] * D,
                     r == 0 ? &la : nullptr);
    }
  }
}

}  // namespace

bool use_decode_attention(const AttentionShape& s) { return s.Tq <= kDecodeQueryRows; }

void decode_attention_forward(const AttentionShape& s, const float* q, const void* k, const void* v,
                              bool kv_bf16, float* o, float* lse) {
  check_shape("decode_attention_forward", s);
  parallel_units(s.B * s.Hkv, [&](int64_t u0, int64_t u1) {
    thread_local AlignedFloats scratch;  // both grow once: a decoded token allocates nothing
    thread_local std::vector<int64_t> rows;
    thread_local std::vector<Span> spans;
    for (int64_t u = u0; u < u1; ++u)
      if (kv_bf16)
        decode_task(s, u / s.Hkv, u % s.Hkv, q, static_cast<const uint16_t*>(k),
                    static_cast<const uint16_t*>(v), o, lse, scratch, rows, spans);
      else
        decode_task(s, u / s.Hkv, u % s.Hkv, q, static_cast<const float*>(k),
                    static_cast<const float*>(v), o, lse, scratch, rows, spans);
  });
}

}  // namespace redco::cpu
