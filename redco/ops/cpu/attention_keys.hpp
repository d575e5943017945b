#pragma once
// What the tiled attention kernels (attention.cpp) and the decode kernel
// (attention_decode.cpp) share: shape checks, which keys a batch row and a
// query see (padding, causal offsets), the bias, and the task split.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/attention.hpp"

namespace redco::cpu::attention_detail {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using CRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

inline void check_shape(const char* op, const AttentionShape& s) {
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
inline KeyRange keys_of(const AttentionShape& s, int64_t b) {
  return {s.key_begin ? s.key_begin[b] : 0, s.key_end ? s.key_end[b] : s.Tk,
          s.causal_offset ? s.causal_offset[b] : s.Tk - s.Tq};
}

// Keys [.., end) are visible to at least one of the queries [.., i1).
inline int64_t key_end(const AttentionShape& s, KeyRange kr, int64_t i1) {
  const int64_t causal_end = s.causal ? std::clamp<int64_t>(i1 + kr.off, 0, s.Tk) : s.Tk;
  return std::min(causal_end, kr.end);
}

// Of the c keys starting at j0, the ones query i sees: [lo, hi) within the tile.
struct Span {
  int64_t lo, hi;
};
inline Span visible_in_tile(const AttentionShape& s, KeyRange kr, int64_t i, int64_t j0,
                            int64_t c) {
  int64_t hi = std::clamp<int64_t>(kr.end - j0, 0, c);
  if (s.causal) hi = std::min(hi, std::clamp<int64_t>(i + kr.off + 1 - j0, 0, c));
  const int64_t lo = std::clamp<int64_t>(kr.begin - j0, 0, c);
  return {lo, std::max(lo, hi)};
}

// Adds the bias entries of row i (keys j0 + lo .. j0 + hi) to a score row.
inline void add_bias(const AttentionShape& s, const float* bias_h, int64_t i, int64_t j0, Span v,
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

}  // namespace redco::cpu::attention_detail
