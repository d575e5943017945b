// Fused scaled-dot-product attention on the CPU, flash-attention style.
//
// Forward. Queries are cut into tiles of kBr rows and keys into tiles of kBc
// columns. A query tile walks the key tiles keeping, per row, the running max
// m of its scores, the running sum l of exp(score - m), and the unnormalised
// output acc = sum_j exp(s_j - m) v_j. When a new key tile raises the max, the
// old l and acc are rescaled by exp(m_old - m_new) (online softmax), so one
// pass over the keys yields o = acc / l and lse = m + log l. Only a kBr x kBc
// score tile exists at a time: memory is O(T) per head, never T x T.
//
// Backward. With lse saved, P for any tile is rebuilt as exp(s - lse) without
// a pass over the whole row. With Delta_i = rowsum(dO_i * O_i) (equal to
// sum_j P_ij dP_ij), the softmax backward is dS = P * (dP - Delta), and
//   dV_j += P^T dO_i,   dP = dO_i V_j^T,   dQ_i += scale dS K_j,   dK_j += scale dS^T Q_i.
// Key tiles are the outer loop, so a key tile's dK/dV rows have exactly one
// writer and stay hot in cache while every query tile of every query head that
// shares the kv head (grouped-query attention) is streamed past them.
//
// Causal masking: query i sees keys j <= i + (Tk - Tq). Key tiles entirely
// past a query tile's last visible key are never visited; tiles that straddle
// the diagonal exponentiate only each row's visible prefix and zero the rest,
// so no -inf ever enters the arithmetic. A query that sees no key at all
// (causal with Tq > Tk, or Tk == 0) gets o = 0, lse = -inf and zero gradient.
//
// Padding: batch row b may see only keys [key_begin[b], key_end[b]) (left
// or right padding), and its queries may sit anywhere among the keys
// (causal_offset[b]: a KV cache's rows of different lengths); tiles outside the range are skipped
// like causal ones and cut ones exponentiate only the visible span. A bias [Hq, Tq, Tk] (T5's
// relative positions; [B, Hq, Tq, Tk] when each batch row has its own) is added to the scaled
// scores of the visible span; its gradient is dS itself, written per batch row and summed by the
// caller.
//
// Tile products go through redco::cpu::sgemm (oneDNN underneath); at 64x64x64
// it beat Eigen's GEMM on mapped tiles (tools/bench/README.md, ## Attention).
// The per-element work (max, exp, rescale) uses Eigen arrays, which vectorise
// exp. Scratch is one small buffer per TBB worker, reused for every tile.
#include "redco/ops/cpu/attention.hpp"

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

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
#include "redco/core/error.hpp"
#include "redco/ops/cpu/gemm.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco::cpu {
namespace {

// Query rows / key columns per tile. 64 x 64 keeps a score tile at 16 KiB, and
// with D = 64 the Q, K, V, dO tiles of one step (4 x 16 KiB) fit in L2 along
// with the score and dP tiles, while each tile product is large enough
// (64^3 multiply-adds) that the GEMM call overhead is a few percent.
constexpr int64_t kBr = 64;
constexpr int64_t kBc = 64;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using CRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

void check_shape(const char* op, const AttentionShape& s) {
  REDCO_CHECK(s.B >= 0 && s.Tq >= 0 && s.Tk >= 0, "{}: need B, Tq, Tk >= 0, got B={} Tq={} Tk={}",
              op, s.B, s.Tq, s.Tk);
  REDCO_CHECK(s.D >= 1, "{}: head dim D must be >= 1, got {}", op, s.D);
  REDCO_CHECK(s.Hkv >= 1 && s.Hq >= 1 && s.Hq % s.Hkv == 0,
              "{}: query heads Hq={} must be a positive multiple of kv heads Hkv={}", op, s.Hq,
              s.Hkv);
  REDCO_CHECK(std::isfinite(s.scale), "{}: scale must be finite, got {}", op, s.scale);
}

// The keys one batch row may see at all (padding), [begin, end), and its
// causal offset: query i sees keys j <= i + off (Tk - Tq: the queries are the
// last Tq positions; a KV cache gives each row its own).
struct KeyRange {
  int64_t begin, end, off;
};
KeyRange keys_of(const AttentionShape& s, int64_t b) {
  return {s.key_begin ? s.key_begin[b] : 0, s.key_end ? s.key_end[b] : s.Tk,
          s.causal_offset ? s.causal_offset[b] : s.Tk - s.Tq};
}

// Keys [.., end) are visible to at least one of the queries [.., i1).
int64_t key_end(const AttentionShape& s, KeyRange kr, int64_t i1) {
  const int64_t causal_end = s.causal ? std::clamp<int64_t>(i1 + kr.off, 0, s.Tk) : s.Tk;
  return std::min(causal_end, kr.end);
}

// Of the c keys starting at j0, the ones query i sees: [lo, hi) within the tile.
struct Span {
  int64_t lo, hi;
};
Span visible_in_tile(const AttentionShape& s, KeyRange kr, int64_t i, int64_t j0, int64_t c) {
  int64_t hi = std::clamp<int64_t>(kr.end - j0, 0, c);
  if (s.causal) hi = std::min(hi, std::clamp<int64_t>(i + kr.off + 1 - j0, 0, c));
  const int64_t lo = std::clamp<int64_t>(kr.begin - j0, 0, c);
  return {lo, std::max(lo, hi)};
}

// Adds the bias entries of row i (keys j0 + lo .. j0 + hi) to a score row.
void add_bias(const AttentionShape& s, const float* bias_h, int64_t i, int64_t j0, Span v,
              float* row) {
  if (bias_h && v.hi > v.lo)
    Row(row + v.lo, v.hi - v.lo) += CRow(bias_h + i * s.Tk + j0 + v.lo, v.hi - v.lo);
}

// Runs f(begin, end) over [0, n) on TBB, one index per task when each index is
// a tile-sized job (the default partitioner groups them when that pays).
template <typename F>
void parallel_units(int64_t n, const F& f) {
  if (n <= 0) return;
  if (n == 1) return f(int64_t{0}, int64_t{1});
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n),
                    [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.end()); });
}

// ---------------------------------------------------------------- forward --

// Scratch of one forward worker, carved from one allocation.
struct FwdScratch {
  float* S;    // [kBr, kBc] scores of the current tile, then exp(score - m)
  float* acc;  // [kBr, D] unnormalised output: sum_j exp(s_ij - m_i) v_j
  float* m;    // [kBr] running max of each row's scores (-inf: no key seen yet)
  float* l;    // [kBr] running sum of exp(s_ij - m_i)
  static int64_t floats(int64_t D) { return kBr * kBc + kBr * D + 2 * kBr; }
  FwdScratch(float* base, int64_t D)
      : S(base), acc(base + kBr * kBc), m(acc + kBr * D), l(m + kBr) {}
};

// Folds one score tile (rows i0.., keys j0..j0+c) into the running state and
// turns S into the tile's probabilities (unnormalised, relative to the new m).
void online_softmax_step(const AttentionShape& s, KeyRange kr, const float* bias_h, FwdScratch& w,
                         int64_t i0, int64_t r, int64_t j0, int64_t c) {
  for (int64_t ii = 0; ii < r; ++ii) {
    float* srow = w.S + ii * kBc;
    const Span v = visible_in_tile(s, kr, i0 + ii, j0, c);
    std::fill(srow, srow + v.lo, 0.f);
    std::fill(srow + v.hi, srow + c, 0.f);
    if (v.hi == v.lo) continue;  // row sees nothing here: p = 0, state unchanged
    add_bias(s, bias_h, i0 + ii, j0, v, srow);
    Row p(srow + v.lo, v.hi - v.lo);
    const float m_new = std::max(w.m[ii], p.maxCoeff());
    // exp(-inf) = 0: a row's first visible tile drops the (zero) old state.
    const float alpha = std::exp(w.m[ii] - m_new);
    p = (p - m_new).exp();
    w.l[ii] = alpha * w.l[ii] + p.sum();
    if (alpha != 1.f) Row(w.acc + ii * s.D, s.D) *= alpha;
    w.m[ii] = m_new;
  }
}

// One query tile [i0, i1) of one head: q, o are that head's [Tq, D] rows,
// k, v its kv head's [Tk, D] rows, lse its [Tq] entries, bias_h its [Tq, Tk]
// bias (or null); kr the keys its batch row sees.
void forward_tile(const AttentionShape& s, KeyRange kr, const float* bias_h, const float* q,
                  const float* k, const float* v, float* o, float* lse, int64_t i0, int64_t i1,
                  FwdScratch& w) {
  const int64_t r = i1 - i0, D = s.D;
  std::fill(w.m, w.m + r, kNegInf);
  std::fill(w.l, w.l + r, 0.f);
  std::fill(w.acc, w.acc + r * D, 0.f);
  const int64_t j_end = key_end(s, kr, i1);
  for (int64_t j0 = std::max<int64_t>(0, kr.begin) / kBc * kBc; j0 < j_end; j0 += kBc) {
    const int64_t c = std::min(kBc, j_end - j0);
    sgemm(false, true, r, c, D, s.scale, q + i0 * D, D, k + j0 * D, D, 0.f, w.S, kBc);
    online_softmax_step(s, kr, bias_h, w, i0, r, j0, c);
    sgemm(false, false, r, D, c, 1.f, w.S, kBc, v + j0 * D, D, 1.f, w.acc, D);
  }
  for (int64_t ii = 0; ii < r; ++ii) {
    Row orow(o + (i0 + ii) * D, D);
    if (w.l[ii] == 0.f) {  // no visible key
      orow.setZero();
      lse[i0 + ii] = kNegInf;
      continue;
    }
    orow = CRow(w.acc + ii * D, D) * (1.f / w.l[ii]);
    lse[i0 + ii] = w.m[ii] + std::log(w.l[ii]);
  }
}

// --------------------------------------------------------------- backward --

// Scratch of one backward worker.
struct BwdScratch {
  float* P;   // [kBr, kBc] probabilities of the current tile
  float* dS;  // [kBr, kBc] dP = dO V^T, then dS = P * (dP - Delta)
  static int64_t floats() { return 2 * kBr * kBc; }
  explicit BwdScratch(float* base) : P(base), dS(base + kBr * kBc) {}
};

// One query head's view for the backward: [Tq, D] rows of q, dO and of the dq
// accumulator, and the [Tq] lse and Delta entries.
struct QHead {
  const float* q;
  const float* dout;
  const float* lse;
  const float* delta;
  float* dq;
  const float* bias;  // [Tq, Tk] or null
  float* dbias;       // [Tq, Tk] of this batch row, or null
};

// One kv head's [Tk, D] rows of k, v and of the dk, dv outputs.
struct KvHead {
  const float* k;
  const float* v;
  float* dk;
  float* dv;
  KeyRange keys;  // of its batch row
};

// P = exp(scale q k^T + bias - lse) on each row's visible keys, 0 elsewhere.
void rebuild_probabilities(const AttentionShape& s, const QHead& qh, KeyRange kr, BwdScratch& w,
                           int64_t i0, int64_t r, int64_t j0, int64_t c) {
  for (int64_t ii = 0; ii < r; ++ii) {
    float* prow = w.P + ii * kBc;
    const Span v = visible_in_tile(s, kr, i0 + ii, j0, c);
    std::fill(prow, prow + v.lo, 0.f);
    std::fill(prow + v.hi, prow + c, 0.f);
    if (v.hi == v.lo) continue;
    add_bias(s, qh.bias, i0 + ii, j0, v, prow);
    Row(prow + v.lo, v.hi - v.lo) = (Row(prow + v.lo, v.hi - v.lo) - qh.lse[i0 + ii]).exp();
  }
}

// Contribution of query tile [i0, i0 + r) of one head to key tile [j0, j0 + c).
void backward_pair(const AttentionShape& s, const QHead& qh, const KvHead& kv, BwdScratch& w,
                   int64_t i0, int64_t r, int64_t j0, int64_t c) {
  const int64_t D = s.D;
  const float* qi = qh.q + i0 * D;      // [r, D]
  const float* doi = qh.dout + i0 * D;  // [r, D]
  const float* kj = kv.k + j0 * D;      // [c, D]
  sgemm(false, true, r, c, D, s.scale, qi, D, kj, D, 0.f, w.P, kBc);
  rebuild_probabilities(s, qh, kv.keys, w, i0, r, j0, c);
  // dV_j += P^T dO_i
  sgemm(true, false, c, D, r, 1.f, w.P, kBc, doi, D, 1.f, kv.dv + j0 * D, D);
  // dP = dO_i V_j^T, then dS = P * (dP - Delta) row by row.
  sgemm(false, true, r, c, D, 1.f, doi, D, kv.v + j0 * D, D, 0.f, w.dS, kBc);
  for (int64_t ii = 0; ii < r; ++ii) {
    Row ds(w.dS + ii * kBc, c);
    ds = CRow(w.P + ii * kBc, c) * (ds - qh.delta[i0 + ii]);
    // The bias enters the scores unscaled: its gradient is dS itself.
    if (qh.dbias) std::copy_n(w.dS + ii * kBc, c, qh.dbias + (i0 + ii) * s.Tk + j0);
  }
  // dQ_i += scale dS K_j,   dK_j += scale dS^T Q_i
  sgemm(false, false, r, D, c, s.scale, w.dS, kBc, kj, D, 1.f, qh.dq + i0 * D, D);
  sgemm(true, false, c, D, r, s.scale, w.dS, kBc, qi, D, 1.f, kv.dk + j0 * D, D);
}

// All gradient work of key tile [j0, j0 + c) of one kv head: it is the only
// writer of those dk, dv rows; dq rows go to the accumulator in each QHead.
void backward_key_tile(const AttentionShape& s, const QHead* heads, int64_t n_heads,
                       const KvHead& kv, BwdScratch& w, int64_t j0, int64_t c) {
  const int64_t D = s.D;
  std::fill(kv.dk + j0 * D, kv.dk + (j0 + c) * D, 0.f);
  std::fill(kv.dv + j0 * D, kv.dv + (j0 + c) * D, 0.f);
  if (j0 >= kv.keys.end || j0 + c <= kv.keys.begin) return;  // padding: no query sees it
  // Causal: the first query that sees key j0 is j0 - off; earlier tiles see none.
  const int64_t first = s.causal ? std::clamp<int64_t>(j0 - kv.keys.off, 0, s.Tq) : 0;
  for (int64_t t = 0; t < n_heads; ++t)
    for (int64_t i0 = first / kBr * kBr; i0 < s.Tq; i0 += kBr)
      backward_pair(s, heads[t], kv, w, i0, std::min(kBr, s.Tq - i0), j0, c);
}

// Delta = rowsum(dO * O) for every query row, and dq zeroed (it accumulates).
void backward_prologue(const AttentionShape& s, const float* o, const float* dout, float* delta,
                       float* dq) {
  const int64_t rows = s.B * s.Hq * s.Tq, D = s.D;
  const int64_t grain = std::max<int64_t>(1, 16384 / D);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, grain), [&](const auto& rg) {
    for (int64_t i = rg.begin(); i < rg.end(); ++i) {
      delta[i] = (CRow(o + i * D, D) * CRow(dout + i * D, D)).sum();
      std::fill(dq + i * D, dq + (i + 1) * D, 0.f);
    }
  });
}

// How many interleaved sets each kv head's key tiles are split into. One set
// (one task per (batch, kv head)) when there are enough of those to keep every
// thread busy; otherwise key tiles are split, and every set past the first
// accumulates dq into its own zeroed copy, summed after (no races, no atomics,
// and the result does not depend on scheduling).
int64_t key_splits(const AttentionShape& s) {
  const int64_t tasks = s.B * s.Hkv, tiles = (s.Tk + kBc - 1) / kBc;
  const int64_t threads = tbb::this_task_arena::max_concurrency();
  // Two tasks per thread: whole tasks cannot balance finer than that.
  const int64_t want = 2 * threads;
  if (threads <= 1 || tasks >= want || tiles <= 1) return 1;
  return std::min(tiles, (want + tasks - 1) / tasks);
}

}  // namespace

void flash_attention_forward(const AttentionShape& s, const float* q, const float* k,
                             const float* v, float* o, float* lse) {
  check_shape("flash_attention_forward", s);
  const int64_t D = s.D, group = s.Hq / s.Hkv;
  const int64_t q_tiles = (s.Tq + kBr - 1) / kBr;
  tbb::enumerable_thread_specific<AlignedFloats> scratch(
      [&] { return AlignedFloats(FwdScratch::floats(D)); });
  parallel_units(s.B * s.Hq * q_tiles, [&](int64_t u0, int64_t u1) {
    FwdScratch w(scratch.local().data(), D);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t bh = u / q_tiles, b = bh / s.Hq, h = bh % s.Hq;
      const int64_t i0 = u % q_tiles * kBr, i1 = std::min(s.Tq, i0 + kBr);
      const int64_t kvh = b * s.Hkv + h / group;
      const int64_t bias_head = s.bias_per_row ? bh : h;
      const float* bias_h = s.bias ? s.bias + bias_head * s.Tq * s.Tk : nullptr;
      forward_tile(s, keys_of(s, b), bias_h, q + bh * s.Tq * D, k + kvh * s.Tk * D,
                   v + kvh * s.Tk * D, o + bh * s.Tq * D, lse + bh * s.Tq, i0, i1, w);
    }
  });
}

void flash_attention_backward(const AttentionShape& s, const float* q, const float* k,
                              const float* v, const float* o, const float* lse, const float* dout,
                              float* dq, float* dk, float* dv, float* dbias) {
  check_shape("flash_attention_backward", s);
  REDCO_CHECK(!s.bias || dbias, "flash_attention_backward: a bias needs a dbias buffer");
  const int64_t bias_elems = s.Tq * s.Tk;
  if (dbias) std::fill(dbias, dbias + s.B * s.Hq * bias_elems, 0.f);
  const int64_t D = s.D, group = s.Hq / s.Hkv;
  const int64_t q_elems = s.B * s.Hq * s.Tq * D;
  AlignedFloats delta(static_cast<size_t>(s.B * s.Hq * s.Tq));  // [B, Hq, Tq]
  backward_prologue(s, o, dout, delta.data(), dq);
  const int64_t splits = key_splits(s);
  // [splits - 1, B, Hq, Tq, D]: dq partial sums of key-tile sets 1.. (set 0 writes dq).
  AlignedFloats dq_extra(static_cast<size_t>((splits - 1) * q_elems), 0.f);
  const int64_t key_tiles = (s.Tk + kBc - 1) / kBc;
  tbb::enumerable_thread_specific<AlignedFloats> scratch(
      [] { return AlignedFloats(BwdScratch::floats()); });
  parallel_units(s.B * s.Hkv * splits, [&](int64_t u0, int64_t u1) {
    BwdScratch w(scratch.local().data());
    std::vector<QHead> heads(static_cast<size_t>(group));  // [group]: per task, not per tile
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t bg = u / splits, set = u % splits, b = bg / s.Hkv, g = bg % s.Hkv;
      float* dq_acc = set == 0 ? dq : dq_extra.data() + (set - 1) * q_elems;
      for (int64_t t = 0; t < group; ++t) {
        const int64_t h = g * group + t, bh = b * s.Hq + h;
        heads[t] = QHead{q + bh * s.Tq * D,
                         dout + bh * s.Tq * D,
                         lse + bh * s.Tq,
                         delta.data() + bh * s.Tq,
                         dq_acc + bh * s.Tq * D,
                         s.bias ? s.bias + (s.bias_per_row ? bh : h) * bias_elems : nullptr,
                         s.bias ? dbias + bh * bias_elems : nullptr};
      }
      const KvHead kv{k + bg * s.Tk * D, v + bg * s.Tk * D, dk + bg * s.Tk * D, dv + bg * s.Tk * D,
                      keys_of(s, b)};
      for (int64_t kt = set; kt < key_tiles; kt += splits)
        backward_key_tile(s, heads.data(), group, kv, w, kt * kBc, std::min(kBc, s.Tk - kt * kBc));
    }
  });
  if (splits == 1) return;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, q_elems, 16384), [&](const auto& rg) {
    for (int64_t set = 1; set < splits; ++set) {
      const float* part = dq_extra.data() + (set - 1) * q_elems;
      for (int64_t i = rg.begin(); i < rg.end(); ++i) dq[i] += part[i];
    }
  });
}

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

// S[j] = scale * q . k_j for keys [j0, j1) of kb [Tk, D]; the last call's
// missing keys repeat the last key and are dropped.
template <typename KV>
void scores(const float* q, const KV* kb, int64_t D, int64_t j0, int64_t j1, float scale,
            float* S) {
  for (int64_t j = j0; j < j1; j += kDotKeys) {
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
                           int64_t j1, float* o) {
  __m512 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm512_loadu_ps(o + d0 + 16 * i);
  for (int64_t j = j0; j < j1; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    const KV* vj = vb + j * D + d0;
    for (int i = 0; i < NV; ++i) acc[i] = _mm512_fmadd_ps(pj, load16(vj + 16 * i), acc[i]);
  }
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(o + d0 + 16 * i, acc[i]);
}
#endif

template <typename KV>
void weigh_values(const float* p, const KV* vb, int64_t D, int64_t j0, int64_t j1, float* o) {
  int64_t d = 0;
#if REDCO_DECODE_AVX512
  for (; d + 64 <= D; d += 64) weigh_values16<4>(p, vb, D, d, j0, j1, o);
#endif
  for (; d + 64 <= D; d += 64) weigh_values<8>(p, vb, D, d, j0, j1, o);
  for (; d + 8 <= D; d += 8) weigh_values<1>(p, vb, D, d, j0, j1, o);
  for (; d < D; ++d)
    for (int64_t j = j0; j < j1; ++j) o[d] += p[j] * to_f32(vb[j * D + d]);
}

// The G = group x Tq query rows of one (batch row b, kv head g) task; row r
// is query r % Tq of head g * group + r / Tq. scratch: [G, Tk] scores;
// rows: each row's index into q, o, lse; spans: each row's visible keys.
// KV: float or uint16_t (bf16).
template <typename KV>
void decode_task(const AttentionShape& s, int64_t b, int64_t g, const float* q, const KV* k,
                 const KV* v, float* o, float* lse, AlignedFloats& scratch,
                 std::vector<int64_t>& rows, std::vector<Span>& spans) {
  const int64_t D = s.D, Tk = s.Tk, group = s.Hq / s.Hkv, G = group * s.Tq;
  const KV* kb = k + (b * s.Hkv + g) * Tk * D;  // this kv head's [Tk, D] keys and values
  const KV* vb = v + (b * s.Hkv + g) * Tk * D;
  if (scratch.size() < size_t(G * Tk)) scratch.resize(size_t(G * Tk));
  float* S = scratch.data();
  rows.resize(size_t(G));
  for (int64_t r = 0; r < G; ++r)
    rows[size_t(r)] = (b * s.Hq + g * group + r / s.Tq) * s.Tq + r % s.Tq;
  const KeyRange kr = keys_of(s, b);
  const int64_t j0 = std::clamp<int64_t>(kr.begin, 0, Tk), j1 = std::max(j0, key_end(s, kr, s.Tq));
  for (int64_t jb = j0; jb < j1; jb += kKeyBlock)  // scores: a block of keys for all G rows
    for (int64_t r = 0; r < G; ++r)
      scores(q + rows[size_t(r)] * D, kb, D, jb, std::min(j1, jb + kKeyBlock), s.scale, S + r * Tk);
  spans.assign(size_t(G), Span{0, 0});
  for (int64_t r = 0; r < G; ++r) {  // probabilities over the row's visible span
    const int64_t i = r % s.Tq, h = g * group + r / s.Tq, bh = b * s.Hq + h, row = rows[size_t(r)];
    float* srow = S + r * Tk;
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
  for (int64_t jb = j0; jb < j1; jb += kKeyBlock)  // outputs: a block of values for all G rows
    for (int64_t r = 0; r < G; ++r) {
      const Span sp = spans[size_t(r)];
      const int64_t lo = std::max(jb, sp.lo), hi = std::min({jb + kKeyBlock, j1, sp.hi});
      if (lo < hi) weigh_values(S + r * Tk, vb, D, lo, hi, o + rows[size_t(r)] * D);
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
