// Embedding gather / scatter-add on the CPU.
#include "redco/ops/cpu/embedding.hpp"

#include <tbb/blocked_range.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_sort.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/core/error.hpp"
#include "redco/ops/cpu/panel_layout.hpp"

namespace redco::cpu {
namespace {

// Each parallel task should move at least this many floats, so a tiny lookup
// (a handful of ids) stays on the calling thread.
constexpr int64_t kGrainFloats = 16 * 1024;

// Checked serially before any work so that the error always names the FIRST
// bad position, whatever the thread scheduling, and no output is half-written.
void check_ids(const char* op, const int64_t* ids, int64_t n, int64_t V) {
  REDCO_CHECK(n >= 0 && V >= 0, "{}: negative size (n={}, V={})", op, n, V);
  for (int64_t i = 0; i < n; ++i) {
    REDCO_CHECK(ids[i] >= 0 && ids[i] < V,
                "{}: id {} at position {} is out of range for a table of {} rows", op, ids[i], i,
                V);
  }
}

}  // namespace

void embedding_forward(const float* table, const int64_t* ids, float* out, int64_t n, int64_t V,
                       int64_t D) {
  check_ids("embedding_forward", ids, n, V);
  REDCO_CHECK(D >= 0, "embedding_forward: negative width D={}", D);
  if (n == 0 || D == 0) return;
  const int64_t grain = std::max<int64_t>(1, kGrainFloats / D);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain), [&](const auto& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      std::memcpy(out + i * D, table + ids[i] * D, static_cast<size_t>(D) * sizeof(float));
    }
  });
}

namespace {
// out[i] = row(ids[i], out + i * D) for each of the n lookups: the narrow
// tables widen only the rows they gather.
template <typename Row>
void gather_rows(const int64_t* ids, float* out, int64_t n, int64_t V, int64_t D, const Row& row) {
  check_ids("embedding_forward", ids, n, V);
  REDCO_CHECK(D >= 0, "embedding_forward: negative width D={}", D);
  if (n == 0 || D == 0) return;
  const int64_t grain = std::max<int64_t>(1, kGrainFloats / D);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain), [&](const auto& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) row(ids[i], out + i * D);
  });
}
}  // namespace

void embedding_forward_bf16(const uint16_t* table, const int64_t* ids, float* out, int64_t n,
                            int64_t V, int64_t D) {
  gather_rows(ids, out, n, V, D, [&](int64_t v, float* dst) {
    for (int64_t d = 0; d < D; ++d) dst[d] = bf16_to_float(table[v * D + d]);
  });
}

void embedding_forward_panels(const uint16_t* panels, const int64_t* ids, float* out, int64_t n,
                              int64_t V, int64_t D) {
  gather_rows(ids, out, n, V, D, [&](int64_t v, float* dst) {
    for (int64_t d = 0; d < D; ++d) dst[d] = bf16_to_float(panels[panels::index(v, d, D)]);
  });
}

void embedding_forward_i8(const int8_t* table, const float* scale, const int64_t* ids, float* out,
                          int64_t n, int64_t V, int64_t D) {
  gather_rows(ids, out, n, V, D, [&](int64_t v, float* dst) {
    for (int64_t d = 0; d < D; ++d) dst[d] = float(table[v * D + d]) * scale[v];
  });
}

void embedding_forward_i8_panels(const int8_t* panels, const float* scale, const int64_t* ids,
                                 float* out, int64_t n, int64_t V, int64_t D) {
  gather_rows(ids, out, n, V, D, [&](int64_t v, float* dst) {
    for (int64_t d = 0; d < D; ++d) dst[d] = float(panels[panels::i8::index(v, d, D)]) * scale[v];
  });
}

// Determinism: every dtable element receives its contributions in increasing
// position order i, exactly as the serial loop `for i: dtable[ids[i]] += dout[i]`
// would, so the result is bitwise identical to it for any thread count.
// We get there by grouping positions by id (a sort on (id, i), a total order so
// the permutation is unique) and giving each (id group, column chunk) tile to
// one task: tiles write disjoint parts of dtable, so no atomics are needed.
// Column chunks let a single very frequent id (a padding / end-of-text token)
// still spread across threads.
void embedding_backward(const float* dout, const int64_t* ids, float* dtable, int64_t n, int64_t V,
                        int64_t D) {
  check_ids("embedding_backward", ids, n, V);
  REDCO_CHECK(D >= 0, "embedding_backward: negative width D={}", D);
  if (n == 0 || D == 0) return;
  if (n * D <= kGrainFloats) {  // tiny: the reference loop itself
    for (int64_t i = 0; i < n; ++i) {
      float* dst = dtable + ids[i] * D;
      const float* src = dout + i * D;
      for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
    }
    return;
  }

  // order: [n] positions sorted by (id, position).
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  tbb::parallel_sort(order.begin(), order.end(), [ids](int64_t a, int64_t b) {
    return ids[a] != ids[b] ? ids[a] < ids[b] : a < b;
  });
  // seg_start: [nseg + 1] offsets into `order` of each run of equal ids.
  std::vector<int64_t> seg_start;
  for (int64_t k = 0; k < n; ++k) {
    if (k == 0 || ids[order[k]] != ids[order[k - 1]]) seg_start.push_back(k);
  }
  const auto nseg = static_cast<int64_t>(seg_start.size());
  seg_start.push_back(n);

  // Grains: ~kGrainFloats of dout per tile; columns in chunks of >= 64 floats
  // (whole cache lines, and long enough to vectorise).
  const int64_t col_grain = std::min<int64_t>(D, 64);
  const int64_t rows_per_seg = std::max<int64_t>(1, n / nseg);
  const int64_t seg_grain = std::max<int64_t>(1, kGrainFloats / (rows_per_seg * D));
  using Range = tbb::blocked_range2d<int64_t>;
  tbb::parallel_for(Range(0, nseg, seg_grain, 0, D, col_grain), [&](const Range& r) {
    const int64_t c0 = r.cols().begin(), c1 = r.cols().end();
    for (int64_t s = r.rows().begin(); s < r.rows().end(); ++s) {
      float* dst = dtable + ids[order[seg_start[s]]] * D;
      for (int64_t k = seg_start[s]; k < seg_start[s + 1]; ++k) {
        const float* src = dout + order[k] * D;
        for (int64_t d = c0; d < c1; ++d) dst[d] += src[d];
      }
    }
  });
}

}  // namespace redco::cpu
