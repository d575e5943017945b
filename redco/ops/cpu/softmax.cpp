// Softmax, log-softmax and cross entropy over rows of an [N, D] matrix.
//
// Every row subtracts its max before exponentiating, so exp() never overflows
// and the largest term is exactly 1 (the sum is >= 1, its log is well defined),
// whatever the logits' magnitude. Rows are independent and run in parallel with
// oneTBB; all math goes through Eigen array expressions, which vectorise exp and
// the reductions without temporaries (no allocation per call).
#include "redco/ops/cpu/softmax.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco::cpu {
namespace {

using CRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

// Minimum floats of work per TBB task; tiny inputs stay serial.
constexpr int64_t kGrainElems = 16384;
// Softmax forward writes exp() in blocks of this many floats (16 KiB) and sums
// each block while it is still in L1, instead of re-reading a whole (possibly
// 200 KiB, vocab-sized) row for the sum.
constexpr int64_t kBlock = 4096;

void check_shape(const char* op, int64_t N, int64_t D) {
  REDCO_CHECK(N >= 0 && D >= 1, "{}: need N >= 0 and D >= 1, got N={} D={}", op, N, D);
}

template <typename F>
void for_rows(int64_t N, int64_t D, const F& f) {
  parallel_chunks(N, grain_for(kGrainElems, D), f);
}

// Validated serially before any work so the error is deterministic (first bad
// row) and no output is left half written.
void check_labels(const char* op, const int64_t* labels, int64_t N, int64_t V,
                  int64_t ignore_index) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t l = labels[n];
    REDCO_CHECK(l == ignore_index || (l >= 0 && l < V),
                "{}: row {} has label {}, outside [0, {}) and not ignore_index ({})", op, n, l, V,
                ignore_index);
  }
}

// sum(exp(x - m)) with m = max(x): each term is in [0, 1] and one is exactly 1.
float sum_exp_shifted(const CRow& x, float m) { return (x - m).exp().sum(); }

}  // namespace

void softmax_forward(const float* x, float* y, int64_t N, int64_t D) {
  check_shape("softmax_forward", N, D);
  for_rows(N, D, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const float* xr = x + n * D;
      float* yr = y + n * D;
      const float m = CRow(xr, D).maxCoeff();
      float s = 0.f;
      for (int64_t j = 0; j < D; j += kBlock) {
        const int64_t len = std::min(kBlock, D - j);
        Row yb(yr + j, len);
        yb = (CRow(xr + j, len) - m).exp();
        s += yb.sum();
      }
      Row(yr, D) *= 1.f / s;
    }
  });
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t N, int64_t D) {
  check_shape("softmax_backward", N, D);
  for_rows(N, D, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const CRow yr(y + n * D, D);
      const CRow dyr(dy + n * D, D);
      const float dot = (dyr * yr).sum();
      Row(dx + n * D, D) = yr * (dyr - dot);
    }
  });
}

void log_softmax_forward(const float* x, float* y, int64_t N, int64_t D) {
  check_shape("log_softmax_forward", N, D);
  for_rows(N, D, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const CRow xr(x + n * D, D);
      const float m = xr.maxCoeff();
      // (x - m) - log(s) rather than x - (m + log s): for large |m| the
      // rounding of m + log s would otherwise swamp small log-probabilities.
      const float log_s = std::log(sum_exp_shifted(xr, m));
      Row(y + n * D, D) = (xr - m) - log_s;
    }
  });
}

void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t N, int64_t D) {
  check_shape("log_softmax_backward", N, D);
  for_rows(N, D, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const CRow yr(y + n * D, D);
      const CRow dyr(dy + n * D, D);
      const float s = dyr.sum();
      Row(dx + n * D, D) = dyr - yr.exp() * s;
    }
  });
}

void cross_entropy_forward(const float* logits, const int64_t* labels, float* losses, float* lse,
                           int64_t N, int64_t V, int64_t ignore_index) {
  check_shape("cross_entropy_forward", N, V);
  check_labels("cross_entropy_forward", labels, N, V, ignore_index);
  for_rows(N, V, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      // Ignored rows (padding) skip the V-wide pass entirely; their lse is
      // written as 0 and never read by the backward pass.
      if (labels[n] == ignore_index) {
        losses[n] = 0.f;
        lse[n] = 0.f;
        continue;
      }
      const CRow xr(logits + n * V, V);
      const float m = xr.maxCoeff();
      const float log_s = std::log(sum_exp_shifted(xr, m));
      // (m - x[label]) + log s is exact when the label holds the max, so a
      // confident prediction gets a tiny loss, not the rounding error of lse.
      losses[n] = (m - xr[labels[n]]) + log_s;
      lse[n] = m + log_s;
    }
  });
}

void cross_entropy_backward(const float* logits, const int64_t* labels, const float* lse,
                            const float* dlosses, float* dlogits, int64_t N, int64_t V,
                            int64_t ignore_index) {
  check_shape("cross_entropy_backward", N, V);
  check_labels("cross_entropy_backward", labels, N, V, ignore_index);
  for_rows(N, V, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      Row dr(dlogits + n * V, V);
      if (labels[n] == ignore_index) {
        dr.setZero();
        continue;
      }
      // One streaming pass: read logits, write dloss * softmax; x - lse <= 0
      // (up to rounding), so exp cannot overflow.
      const float dl = dlosses[n];
      dr = (CRow(logits + n * V, V) - lse[n]).exp() * dl;
      dr[labels[n]] -= dl;
    }
  });
}

}  // namespace redco::cpu
