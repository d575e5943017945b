// Reductions and broadcasting, with their gradients: the adjoint of a sum is
// a broadcast and vice versa.
#include <algorithm>
#include <numeric>

#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {
namespace {

// Normalised, sorted, distinct axes; an empty list means every axis.
std::vector<int> normalize_axes(const Shape& s, std::vector<int> axes, const char* op) {
  if (axes.empty()) {
    axes.resize(size_t(s.rank()));
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (int& a : axes) a = s.axis(a);
  std::sort(axes.begin(), axes.end());
  REDCO_CHECK(std::adjacent_find(axes.begin(), axes.end()) == axes.end(),
              "{}: repeated axis in the reduction over {}", op, s);
  return axes;
}

Shape drop_axes(const Shape& s, const std::vector<int>& axes) {
  Shape out = s;
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) out = out.drop(*it);
  return out;
}

Shape keep_axes(const Shape& s, const std::vector<int>& axes) {
  Shape out = s;
  for (int a : axes) out[a] = 1;
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) { return sum(x, {}, false); }

Tensor sum(const Tensor& x, std::vector<int> axes_in, bool keepdim) {
  const auto axes = normalize_axes(x.shape(), std::move(axes_in), "sum");
  Tensor y = kernels::reduce(ReduceOp::sum, x, axes);
  if (!keepdim) y = y.view(drop_axes(x.shape(), axes));
  return record("sum", {x}, y, [xs = x.shape(), axes](const Node&, const TensorList& g) {
    return TensorList{broadcast_to(reshape(g[0], keep_axes(xs, axes)), xs)};
  });
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }

Tensor mean(const Tensor& x, std::vector<int> axes_in, bool keepdim) {
  const auto axes = normalize_axes(x.shape(), std::move(axes_in), "mean");
  int64_t count = 1;
  for (int a : axes) count *= x.dim(a);
  return mul(sum(x, axes, keepdim), 1.f / float(std::max<int64_t>(count, 1)));
}

Tensor max(const Tensor& x, int axis_in, bool keepdim) {
  const int axis = x.shape().axis(axis_in);
  const int axes[] = {axis};
  Tensor y = kernels::reduce(ReduceOp::max, x, axes);  // keeps the axis as size 1
  Tensor y_kept = y;
  if (!keepdim) y = y.view(x.shape().drop(axis));
  return record("max", {x}, y, [x, y_kept, axis](const Node&, const TensorList& g) {
    // The gradient goes to the maxima; tied maxima share it equally.
    Tensor hit = equal(x, y_kept);
    Tensor share = hit / sum(hit, {axis}, true);
    return TensorList{mul(share, reshape(g[0], y_kept.shape()))};
  });
}

Tensor argmax(const Tensor& x, int axis) { return kernels::argmax(x, x.shape().axis(axis)); }

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return record(
      "broadcast_to", {x}, kernels::broadcast_to(x, shape),
      [xs = x.shape()](const Node&, const TensorList& g) { return TensorList{sum_to(g[0], xs)}; });
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const Shape& xs = x.shape();
  const int lead = xs.rank() - shape.rank();
  REDCO_CHECK(lead >= 0, "sum_to: cannot sum {} to the larger rank {}", xs, shape);
  std::vector<int> axes;
  for (int i = 0; i < xs.rank(); ++i) {
    const bool extra = i < lead;
    REDCO_CHECK(extra || shape[i - lead] == xs[i] || shape[i - lead] == 1,
                "sum_to: {} is not a broadcast of {}", xs, shape);
    if (extra || (shape[i - lead] == 1 && xs[i] != 1)) axes.push_back(i);
  }
  Tensor y = axes.empty() ? x : kernels::reduce(ReduceOp::sum, x, axes);
  y = y.view(shape);
  return record("sum_to", {x}, y, [xs](const Node&, const TensorList& g) {
    return TensorList{broadcast_to(g[0], xs)};
  });
}

}  // namespace redco
