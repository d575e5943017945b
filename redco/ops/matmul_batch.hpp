#pragma once
// How a batched matmul's batch dims map onto strided GEMMs: shared by every
// backend, since the broadcasting rules must not differ between devices.
#include <algorithm>
#include <array>
#include <span>

#include "redco/core/error.hpp"
#include "redco/core/shape.hpp"
#include "redco/core/tensor.hpp"

namespace redco::matmul_detail {

using Dims = std::array<int64_t, Shape::kMaxRank>;

// The batch part of a matmul operand: its dims and element strides (0 where
// it is broadcast) against the output's batch dims.
struct Batch {
  int rank = 0;
  Dims dims{}, sa{}, sb{};
};

inline Shape batch_shape(const Shape& s) {
  return Shape(std::span<const int64_t>(s.begin(), size_t(s.rank() - 2)));
}

// Broadcast batch dims of a and b, with each operand's matrix strides along
// them, after dropping size-1 dims and merging dims that are adjacent in both
// operands (so the common cases end up with a single batch dim).
inline Batch broadcast_batch(const Shape& a, const Shape& b, int64_t mat_a, int64_t mat_b) {
  const Shape ba = batch_shape(a), bb = batch_shape(b);
  const int r = std::max(ba.rank(), bb.rank());
  Dims dims{}, sa{}, sb{};
  int64_t acc_a = mat_a, acc_b = mat_b;
  for (int i = r - 1; i >= 0; --i) {
    const int ia = ba.rank() - r + i, ib = bb.rank() - r + i;
    const int64_t da = ia >= 0 ? ba[ia] : 1, db = ib >= 0 ? bb[ib] : 1;
    REDCO_CHECK(da == db || da == 1 || db == 1,
                "matmul: batch dims of shapes {} and {} cannot be broadcast together", a, b);
    dims[size_t(i)] = da == 1 ? db : da;
    sa[size_t(i)] = da == 1 ? 0 : acc_a;
    sb[size_t(i)] = db == 1 ? 0 : acc_b;
    acc_a *= da;
    acc_b *= db;
  }
  Batch out;
  for (int i = 0; i < r; ++i) {
    const int64_t d = dims[size_t(i)];
    if (d == 1) continue;
    const size_t last = size_t(out.rank - 1);
    if (out.rank > 0 && out.sa[last] == sa[size_t(i)] * d && out.sb[last] == sb[size_t(i)] * d) {
      out.dims[last] *= d;
      out.sa[last] = sa[size_t(i)];
      out.sb[last] = sb[size_t(i)];
    } else {
      out.dims[size_t(out.rank)] = d;
      out.sa[size_t(out.rank)] = sa[size_t(i)];
      out.sb[size_t(out.rank)] = sb[size_t(i)];
      ++out.rank;
    }
  }
  return out;
}

// matmul_into's operands checked, and its {M, N, K}: 2-d a and b, an f32
// result [M, N].
inline std::array<int64_t, 3> into_dims(const Tensor& a, const Tensor& b, bool ta, bool tb,
                                        const Tensor& c) {
  REDCO_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2 && c.dtype() == DType::f32,
              "matmul_into: needs 2-d operands and an f32 2-d result, got {} {}, {} {} into {} {}",
              dtype_name(a.dtype()), a.shape(), dtype_name(b.dtype()), b.shape(),
              dtype_name(c.dtype()), c.shape());
  const int64_t M = a.dim(ta ? 1 : 0), K = a.dim(ta ? 0 : 1);
  const int64_t kb = b.dim(tb ? 1 : 0), N = b.dim(tb ? 0 : 1);
  REDCO_CHECK(K == kb && (c.shape() == Shape{M, N}),
              "matmul_into: op(a) {}x{} times op(b) {}x{} does not fit the result {}", M, K, kb, N,
              c.shape());
  return {M, N, K};
}

}  // namespace redco::matmul_detail
