// Elementwise kernels: unary maps, binary ops with numpy broadcasting, and the
// in-place gradient accumulation.
//
// All math is f32. Inputs of another dtype (bf16/f16 activations, integer
// masks) are converted to f32 first and the result is f32: reduced precision is
// a storage format here, and the caller converts back if it wants to.
//
// Binary ops pick the cheapest loop that is exact for the shapes involved:
// same shape (one flat loop), one side a single value (flat loop against a
// constant), one side a trailing block of the other ([.., N] op [N], the bias
// add), and otherwise a general path that walks the output row by row with
// per-operand strides (0 along broadcast axes). The flat loops are plain
// indexed loops over restrict pointers, which GCC vectorises. Work is split
// across threads with oneTBB only above kGrain elements, so the many tiny
// tensors of a training step (scalars, biases) never pay for a task.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"

namespace redco::cpu {
namespace {

constexpr int64_t kGrain = 32768;  // elements per task; below this, stay serial

using CArr = Eigen::Map<const Eigen::ArrayXf>;
using Arr = Eigen::Map<Eigen::ArrayXf>;

Tensor as_f32(const Tensor& x) { return x.dtype() == DType::f32 ? x : x.to(DType::f32); }

// y[0, n) = op(x[0, n)). Eigen supplies vectorised exp/log/tanh/logistic;
// erf has no vectorised float version in Eigen core, so it is a scalar loop.
void unary_block(UnaryOp op, const float* x, float* y, int64_t n) {
  const CArr a(x, n);
  Arr out(y, n);
  switch (op) {
    case UnaryOp::neg:
      out = -a;
      break;
    case UnaryOp::exp:
      out = a.exp();
      break;
    case UnaryOp::log:
      out = a.log();
      break;
    case UnaryOp::tanh:
      out = a.tanh();
      break;
    case UnaryOp::sqrt:
      out = a.sqrt();
      break;
    case UnaryOp::rsqrt:
      out = a.rsqrt();
      break;
    case UnaryOp::sigmoid:
      out = a.logistic();
      break;
    case UnaryOp::relu:
      out = a.max(0.f);
      break;
    case UnaryOp::erf:
      for (int64_t i = 0; i < n; ++i) y[i] = std::erf(x[i]);
      break;
    case UnaryOp::abs:
      out = a.abs();
      break;
    case UnaryOp::square:
      out = a.square();
      break;
    case UnaryOp::reciprocal:
      out = a.inverse();
      break;
    case UnaryOp::step:
      out = (a > 0.f).cast<float>();
      break;
  }
}

// Calls body(f) with f the scalar function of `op`; each caller's loop is then
// instantiated once per op with the function inlined.
template <typename Body>
void with_binary_fn(BinaryOp op, const Body& body) {
  switch (op) {
    case BinaryOp::add:
      return body([](float a, float b) { return a + b; });
    case BinaryOp::sub:
      return body([](float a, float b) { return a - b; });
    case BinaryOp::mul:
      return body([](float a, float b) { return a * b; });
    case BinaryOp::div:
      return body([](float a, float b) { return a / b; });
    case BinaryOp::max:
      return body([](float a, float b) { return a < b ? b : a; });
    case BinaryOp::min:
      return body([](float a, float b) { return b < a ? b : a; });
    case BinaryOp::pow:
      return body([](float a, float b) { return std::pow(a, b); });
    case BinaryOp::eq:
      return body([](float a, float b) { return a == b ? 1.f : 0.f; });
    case BinaryOp::gt:
      return body([](float a, float b) { return a > b ? 1.f : 0.f; });
  }
}

// out[i] = f(a[i], b[i]).
template <typename F>
void same_shape_loop(const F& f, const float* __restrict a, const float* __restrict b,
                     float* __restrict y, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = f(a[i], b[i]);
  });
}

// out[i] = f(a[i], s) or f(s, a[i]) (scalar_left).
template <typename F>
void scalar_loop(const F& f, const float* __restrict a, float s, bool scalar_left,
                 float* __restrict y, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t i0, int64_t i1) {
    if (scalar_left) {
      for (int64_t i = i0; i < i1; ++i) y[i] = f(s, a[i]);
    } else {
      for (int64_t i = i0; i < i1; ++i) y[i] = f(a[i], s);
    }
  });
}

// a is [rows, n], b is [n]: out[r, j] = f(a[r, j], b[j]) (or f(b[j], a[r, j])).
template <typename F>
void row_loop(const F& f, const float* __restrict a, const float* __restrict b, bool b_left,
              float* __restrict y, int64_t rows, int64_t n) {
  parallel_chunks(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                  [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                      const float* ar = a + r * n;
                      float* yr = y + r * n;
                      if (b_left) {
                        for (int64_t j = 0; j < n; ++j) yr[j] = f(b[j], ar[j]);
                      } else {
                        for (int64_t j = 0; j < n; ++j) yr[j] = f(ar[j], b[j]);
                      }
                    }
                  });
}

// Element strides of x viewed at the rank of `out`: 0 on broadcast axes.
std::array<int64_t, Shape::kMaxRank> broadcast_strides(const Shape& x, const Shape& out) {
  std::array<int64_t, Shape::kMaxRank> st{};
  int64_t s = 1;
  for (int i = out.rank() - 1; i >= 0; --i) {
    const int ix = x.rank() - out.rank() + i;
    const int64_t d = ix >= 0 ? x[ix] : 1;
    st[size_t(i)] = d == 1 ? 0 : s;
    s *= d;
  }
  return st;
}

// Any broadcast: each output row (last axis) starts at offsets computed from
// its multi-index; along the row the operands advance by 0 or 1.
template <typename F>
void general_loop(const F& f, const float* a, const Shape& as, const float* b, const Shape& bs,
                  float* y, const Shape& out) {
  const int r = out.rank();
  const auto sa = broadcast_strides(as, out), sb = broadcast_strides(bs, out);
  const int64_t n = out.last(), rows = out.rows();
  const int64_t ia = r ? sa[size_t(r - 1)] : 0, ib = r ? sb[size_t(r - 1)] : 0;
  parallel_chunks(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                  [&](int64_t r0, int64_t r1) {
                    for (int64_t row = r0; row < r1; ++row) {
                      int64_t oa = 0, ob = 0, rest = row;
                      for (int d = r - 2; d >= 0; --d) {
                        const int64_t idx = rest % out[d];
                        rest /= out[d];
                        oa += idx * sa[size_t(d)];
                        ob += idx * sb[size_t(d)];
                      }
                      float* yr = y + row * n;
                      for (int64_t j = 0; j < n; ++j) yr[j] = f(a[oa + j * ia], b[ob + j * ib]);
                    }
                  });
}

// True when x, as a broadcast operand of `out`, is exactly a copy of out's
// trailing numel(x) elements: its shape without leading 1s is a suffix of out.
bool is_trailing_block(const Shape& x, const Shape& out) {
  int lead = 0;
  while (lead < x.rank() && x[lead] == 1) ++lead;
  const int k = x.rank() - lead;
  if (k > out.rank()) return false;
  for (int i = 0; i < k; ++i)
    if (x[lead + i] != out[out.rank() - k + i]) return false;
  return true;
}

template <typename F>
void binary_dispatch(const F& f, const Tensor& a, const Tensor& b, Tensor& y) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
  if (a.numel() == n && b.numel() == n) {
    same_shape_loop(f, pa, pb, py, n);  // equal up to leading 1s: same flat order
  } else if (b.numel() == 1) {
    scalar_loop(f, pa, *pb, false, py, n);
  } else if (a.numel() == 1) {
    scalar_loop(f, pb, *pa, true, py, n);
  } else if (a.numel() == n && is_trailing_block(b.shape(), y.shape())) {
    row_loop(f, pa, pb, false, py, n / b.numel(), b.numel());
  } else if (b.numel() == n && is_trailing_block(a.shape(), y.shape())) {
    row_loop(f, pb, pa, true, py, n / a.numel(), a.numel());
  } else {
    general_loop(f, pa, a.shape(), pb, b.shape(), py, y.shape());
  }
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x_in) {
  const Tensor x = as_f32(x_in);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_chunks(x.numel(), kGrain,
                  [&](int64_t i0, int64_t i1) { unary_block(op, px + i0, py + i0, i1 - i0); });
  return y;
}

Tensor binary(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const Shape out = broadcast_shapes(a_in.shape(), b_in.shape(), binary_name(op));
  const Tensor a = as_f32(a_in), b = as_f32(b_in);
  Tensor y = Tensor::empty(out, DType::f32, a.device());
  if (y.numel() == 0) return y;
  with_binary_fn(op, [&](auto f) { binary_dispatch(f, a, b, y); });
  return y;
}

Tensor binary_scalar(BinaryOp op, const Tensor& a_in, float s) {
  const Tensor a = as_f32(a_in);
  Tensor y = Tensor::empty(a.shape(), DType::f32, a.device());
  const float* pa = a.data<float>();
  float* py = y.data<float>();
  with_binary_fn(op, [&](auto f) { scalar_loop(f, pa, s, false, py, a.numel()); });
  return y;
}

void add_inplace(Tensor& a, const Tensor& b_in) {
  check_same_shape(a, b_in, "add_inplace");
  if (a.dtype() != DType::f32) {
    // Accumulate in f32 and round once into a's storage dtype.
    a.copy_from(binary(BinaryOp::add, a, b_in));
    return;
  }
  const Tensor b = as_f32(b_in);
  // No restrict: a += a is a legal call.
  float* pa = a.data<float>();
  const float* pb = b.data<float>();
  parallel_chunks(a.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) pa[i] += pb[i];
  });
}

}  // namespace redco::cpu
