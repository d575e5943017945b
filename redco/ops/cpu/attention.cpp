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

#include "redco/core/dtype.hpp"
#include "redco/core/error.hpp"
#include "redco/ops/cpu/attention_keys.hpp"
#include "redco/ops/cpu/gemm.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco::cpu {
namespace {

using namespace attention_detail;

// Query rows / key columns per tile. 64 x 64 keeps a score tile at 16 KiB, and
// with D = 64 the Q, K, V, dO tiles of one step (4 x 16 KiB) fit in L2 along
// with the score and dP tiles, while each tile product is large enough
// (64^3 multiply-adds) that the GEMM call overhead is a few percent.
constexpr int64_t kBr = 64;
constexpr int64_t kBc = 64;

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
  REDCO_CHECK(!s.block_table,
              "flash_attention_forward: a paged KV cache is read by the decode "
              "kernel only (gather its blocks first)");
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
  REDCO_CHECK(!s.block_table, "flash_attention_backward: a paged KV cache serves inference only");
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

}  // namespace redco::cpu
