// Fused layer norm / RMS norm on the CPU.
//
// Rows are independent in the forward pass and in dx, so both parallelise over
// rows with oneTBB. A row of D <= 8192 floats (32 KiB) stays in L1/L2 between the
// few passes a row needs, so each kernel streams x (and dy) from memory once.
//
// dgamma/dbeta reduce over N. Each fixed chunk of rows accumulates its own
// partial sums, and the partials are added in chunk order afterwards; chunk
// boundaries depend only on (N, D), never on the thread count or on which thread
// ran which chunk, so the gradients are bitwise reproducible.
#include "redco/ops/cpu/norm.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco::cpu {
namespace {

using CRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

// Minimum floats of work per TBB task: below this the scheduling overhead is
// larger than the work, and tiny inputs stay serial on the calling thread.
constexpr int64_t kGrainElems = 16384;
// Upper bound on dgamma chunks: bounds the partial-sum scratch (kMaxChunks x
// 2 x D floats) and the serial-per-column combine cost.
constexpr int64_t kMaxChunks = 64;

void check_shape(const char* op, int64_t N, int64_t D) {
  REDCO_CHECK(N >= 0 && D >= 1, "{}: need N >= 0 and D >= 1, got N={} D={}", op, N, D);
}

// Calls f(row_begin, row_end) over [0, N), in parallel when there is enough work.
template <typename F>
void for_rows(int64_t N, int64_t D, const F& f) {
  parallel_chunks(N, grain_for(kGrainElems, D), f);
}

// Scratch for the dgamma/dbeta partials, kept per calling thread so steady-state
// training steps do not page-fault a fresh allocation every call.
AlignedFloats& partial_scratch() {
  thread_local AlignedFloats buf;
  return buf;
}

// Runs chunk(r0, r1, part) over fixed row chunks, where part is that chunk's
// zeroed [nout, D] accumulator, then writes outs[k][j] = sum over chunks (in
// chunk order) of part[k][j]. Null entries of outs are skipped.
template <typename ChunkFn>
void reduce_over_rows(int64_t N, int64_t D, int nout, float* const* outs, const ChunkFn& chunk) {
  const int64_t want = std::clamp<int64_t>(N * D / kGrainElems, 1, kMaxChunks);
  const int64_t rows = std::max<int64_t>(1, (N + want - 1) / want);
  const int64_t nchunks = (N + rows - 1) / rows;  // 0 when N == 0
  const int64_t stride = nout * D;                // floats per chunk: [nout, D]
  AlignedFloats& scratch = partial_scratch();
  if (static_cast<int64_t>(scratch.size()) < nchunks * stride) scratch.resize(nchunks * stride);
  float* parts = scratch.data();

  auto run_chunk = [&](int64_t c) {
    float* part = parts + c * stride;
    std::fill(part, part + stride, 0.f);
    chunk(c * rows, std::min(N, (c + 1) * rows), part);
  };
  // Columns are combined independently, so splitting them across threads keeps
  // each column's summation order fixed.
  auto combine = [&](int64_t j0, int64_t j1) {
    for (int k = 0; k < nout; ++k) {
      if (outs[k] == nullptr) continue;
      Row out(outs[k] + j0, j1 - j0);
      out.setZero();
      for (int64_t c = 0; c < nchunks; ++c) out += CRow(parts + c * stride + k * D + j0, j1 - j0);
    }
  };
  // isolate: while this thread waits it must not pick up an unrelated task
  // that could re-enter this function and reuse the thread-local scratch.
  tbb::this_task_arena::isolate([&] {
    if (nchunks <= 1) {
      if (nchunks == 1) run_chunk(0);
    } else {
      tbb::parallel_for(int64_t{0}, nchunks, run_chunk);
    }
    if (D * std::max<int64_t>(nchunks, 1) <= kGrainElems) {
      combine(0, D);
    } else {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, D, 1024),
                        [&](const tbb::blocked_range<int64_t>& r) { combine(r.begin(), r.end()); });
    }
  });
}

}  // namespace

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, int64_t N, int64_t D, float eps) {
  check_shape("layer_norm_forward", N, D);
  const CRow g(gamma, D);
  for_rows(N, D, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const CRow xr(x + n * D, D);
      Row yr(y + n * D, D);
      // Corrected two-pass variance: centre on a first estimate m0, then
      // c = mean(x - m0) removes the rounding error of m0 and
      // var = mean((x - m0)^2) - c^2 has no catastrophic cancellation even
      // when |mean| >> std, because x - m0 is already small.
      const float m0 = xr.sum() / static_cast<float>(D);
      const float c = (xr - m0).sum() / static_cast<float>(D);
      const float var = std::max((xr - m0).square().sum() / static_cast<float>(D) - c * c, 0.f);
      const float r = 1.f / std::sqrt(var + eps);
      // (x - m0) - c keeps the correction even when m0 + c rounds back to m0.
      if (beta != nullptr) {
        yr = ((xr - m0) - c) * r * g + CRow(beta, D);
      } else {
        yr = ((xr - m0) - c) * r * g;
      }
      mean[n] = m0 + c;
      rstd[n] = r;
    }
  });
}

void layer_norm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t N,
                         int64_t D) {
  check_shape("layer_norm_backward", N, D);
  const CRow g(gamma, D);
  const float inv_d = 1.f / static_cast<float>(D);
  float* outs[2] = {dgamma, dbeta};
  reduce_over_rows(N, D, 2, outs, [&](int64_t r0, int64_t r1, float* part) {
    Row dg(part, D);      // [D] partial dgamma
    Row db(part + D, D);  // [D] partial dbeta
    for (int64_t n = r0; n < r1; ++n) {
      const CRow xr(x + n * D, D);
      const CRow dyr(dy + n * D, D);
      const float m0 = mean[n];
      const float r = rstd[n];
      // The saved float mean can be off by half an ulp of |mean|; recovering the
      // residual c keeps xhat accurate for rows with a large mean (as forward).
      const float c = (xr - m0).sum() * inv_d;
      const auto xhat = ((xr - m0) - c) * r;
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
      const float a = (dyr * g).sum() * inv_d;
      const float b = (dyr * g * xhat).sum() * inv_d;
      Row(dx + n * D, D) = r * ((dyr * g - a) - xhat * b);
      dg += dyr * xhat;
      db += dyr;
    }
  });
}

void rms_norm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t N,
                      int64_t D, float eps) {
  check_shape("rms_norm_forward", N, D);
  const CRow g(gamma, D);
  for_rows(N, D, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const CRow xr(x + n * D, D);
      // A sum of squares has no cancellation; Eigen's vectorised sum keeps
      // several partial accumulators, so the error grows slowly with D.
      const float r = 1.f / std::sqrt(xr.square().sum() / static_cast<float>(D) + eps);
      Row(y + n * D, D) = xr * r * g;
      rstd[n] = r;
    }
  });
}

void rms_norm_backward(const float* dy, const float* x, const float* gamma, const float* rstd,
                       float* dx, float* dgamma, int64_t N, int64_t D) {
  check_shape("rms_norm_backward", N, D);
  const CRow g(gamma, D);
  const float inv_d = 1.f / static_cast<float>(D);
  float* outs[1] = {dgamma};
  reduce_over_rows(N, D, 1, outs, [&](int64_t r0, int64_t r1, float* part) {
    Row dg(part, D);  // [D] partial dgamma
    for (int64_t n = r0; n < r1; ++n) {
      const CRow xr(x + n * D, D);
      const CRow dyr(dy + n * D, D);
      const float r = rstd[n];
      const auto xhat = xr * r;
      // dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma.
      const float b = (dyr * g * xhat).sum() * inv_d;
      Row(dx + n * D, D) = r * (dyr * g - xhat * b);
      dg += dyr * xhat;
    }
  });
}

}  // namespace redco::cpu
