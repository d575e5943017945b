// Reductions (sum, max over any set of axes) and argmax.
//
// Every reduction is brought to the form [O, R, I]: O kept outer elements, R
// reduced, I kept inner elements (contiguous). Adjacent reduced axes merge, so
// one contiguous run of reduced axes is one pass; a non-contiguous set (e.g.
// axes {0, 2} of a 3-D tensor) is done as successive passes, innermost run
// first. Two loops cover every pass:
//   I == 1 (last-axis, e.g. a row sum): each output is a reduction of a
//           contiguous row;
//   I > 1  (leading/middle axis, e.g. the bias gradient sum over the batch):
//           rows of I elements are accumulated elementwise, which streams
//           memory in order and vectorises across I.
// Sums are careful about rounding: a row is added in 16 float lanes over
// blocks of 256 elements, and the block sums in double; column sums
// accumulate in double. Either way the error does not grow with the length of
// a long row the way a single float accumulator's does.
// Inputs of other dtypes are converted to f32; the result is f32.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <Eigen/Core>
#include <algorithm>
#include <limits>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"

namespace redco::cpu {
namespace {

constexpr int64_t kGrain = 32768;  // elements of input per task
// Inner elements one task accumulates at once: wide blocks stream long runs
// of each source row (far faster than short strided strips), narrow ones give
// every core a task when O is small; col_block picks between them.
constexpr int64_t kColBlock = 2048;
constexpr int64_t kMinColBlock = 256;
constexpr int64_t kSumBlock = 256;
constexpr int kLanes = 16;

Tensor as_f32(const Tensor& x) { return x.dtype() == DType::f32 ? x : x.to(DType::f32); }

int64_t grain_for(int64_t work_per_item) { return cpu::grain_for(kGrain, work_per_item); }

double sum_row(const float* p, int64_t n) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t len = std::min(kSumBlock, n - b);
    const float* q = p + b;
    float lanes[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += q[j + l];
    double s = 0;
    for (; j < len; ++j) s += q[j];
    for (int l = 0; l < kLanes; ++l) s += lanes[l];
    total += s;
  }
  return total;
}

float max_row(const float* p, int64_t n) {
  if (n == 0) return -std::numeric_limits<float>::infinity();
  return Eigen::Map<const Eigen::ArrayXf>(p, n).maxCoeff();
}

// y[o] = reduce(x[o, 0:R]).
void reduce_rows(ReduceOp op, const float* x, float* y, int64_t O, int64_t R) {
  parallel_chunks(O, grain_for(R), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      y[o] = op == ReduceOp::sum ? float(sum_row(x + o * R, R)) : max_row(x + o * R, R);
  });
}

int64_t col_block(int64_t O, int64_t I) {
  const int64_t threads = tbb::this_task_arena::max_concurrency();
  const int64_t blocks_wanted = std::max<int64_t>(1, threads / std::max<int64_t>(O, 1));
  const int64_t w = (I / blocks_wanted + 63) / 64 * 64;
  return std::clamp(w, kMinColBlock, kColBlock);
}

// y[o, i] = reduce over r of x[o, r, i], for i in [i0, i1) (at most kColBlock).
void reduce_columns(ReduceOp op, const float* x, float* y, int64_t R, int64_t I, int64_t i0,
                    int64_t i1) {
  const int64_t w = i1 - i0;
  if (op == ReduceOp::sum) {
    double acc[kColBlock] = {};
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = x + r * I + i0;
      for (int64_t i = 0; i < w; ++i) acc[i] += xr[i];
    }
    for (int64_t i = 0; i < w; ++i) y[i0 + i] = float(acc[i]);
    return;
  }
  float* yb = y + i0;
  std::fill_n(yb, w, -std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * I + i0;
    for (int64_t i = 0; i < w; ++i) yb[i] = yb[i] < xr[i] ? xr[i] : yb[i];
  }
}

// One pass: [O, R, I] -> [O, 1, I].
void reduce_pass(ReduceOp op, const float* x, float* y, int64_t O, int64_t R, int64_t I) {
  if (O == 0 || I == 0) return;
  if (I == 1) {
    reduce_rows(op, x, y, O, R);
    return;
  }
  // Tasks are (o, block of I): enough of them to use every core even when
  // O == 1 (a reduction over the leading axis).
  const int64_t bw = col_block(O, I), blocks = (I + bw - 1) / bw;
  parallel_chunks(O * blocks, grain_for(R * std::min(I, bw)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / blocks, i0 = (t % blocks) * bw;
      reduce_columns(op, x + o * R * I, y + o * I, R, I, i0, std::min(I, i0 + bw));
    }
  });
}

}  // namespace

Tensor reduce(ReduceOp op, const Tensor& x_in, std::span<const int> axes) {
  const Shape& xs = x_in.shape();
  Tensor cur = as_f32(x_in);
  if (axes.empty()) return cur.same(x_in) ? cur.clone() : cur;
  const meta::ReducePasses passes = meta::reduce_passes(xs, axes);
  for (int i = 0; i < passes.count; ++i) {  // each pass writes a fresh tensor
    const meta::ReducePass& p = passes.pass[size_t(i)];
    Tensor next = Tensor::empty(p.out, DType::f32, cur.device());
    reduce_pass(op, cur.data<float>(), next.data<float>(), p.outer, p.reduced, p.inner);
    cur = next;
  }
  return cur;
}

Tensor argmax(const Tensor& x_in, int axis_in) {
  const int axis = x_in.shape().axis(axis_in);
  const Tensor x = as_f32(x_in);
  const Shape& xs = x.shape();
  const int64_t R = xs[axis];
  Tensor y = Tensor::empty(xs.drop(axis), DType::i64, x.device());
  if (y.numel() == 0) return y;
  int64_t O = 1, I = 1;
  for (int d = 0; d < axis; ++d) O *= xs[d];
  for (int d = axis + 1; d < xs.rank(); ++d) I *= xs[d];
  const float* px = x.data<float>();
  int64_t* py = y.data<int64_t>();
  // Strict '>' keeps the first index among equal maxima.
  parallel_chunks(O, grain_for(R * I), [&](int64_t o0, int64_t o1) {
    AlignedFloats best(static_cast<size_t>(I));
    for (int64_t o = o0; o < o1; ++o) {
      const float* xo = px + o * R * I;
      int64_t* yo = py + o * I;
      std::copy_n(xo, I, best.begin());
      std::fill_n(yo, I, int64_t{0});
      for (int64_t r = 1; r < R; ++r) {
        const float* xr = xo + r * I;
        for (int64_t i = 0; i < I; ++i) {
          if (xr[i] > best[size_t(i)]) {
            best[size_t(i)] = xr[i];
            yo[i] = r;
          }
        }
      }
    }
  });
  return y;
}

}  // namespace redco::cpu
