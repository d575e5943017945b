// Shape ops. Reshape is a free view; transposes, slices and concatenation
// copy (every tensor is contiguous). Each gradient is the inverse layout op.
#include <numeric>

#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {

Tensor reshape(const Tensor& x, const Shape& shape) {
  return record("reshape", {x}, x.view(shape), [xs = x.shape()](const Node&, const TensorList& g) {
    return TensorList{reshape(g[0], xs)};
  });
}

Tensor flatten(const Tensor& x, int start_axis) {
  const int a = x.rank() == 0 ? 0 : x.shape().axis(start_axis);
  Shape s;
  int64_t rest = 1;
  for (int i = 0; i < x.rank(); ++i) {
    if (i < a)
      s = s.append(x.dim(i));
    else
      rest *= x.dim(i);
  }
  return reshape(x, s.append(rest));
}

Tensor permute(const Tensor& x, std::vector<int> perm) {
  REDCO_CHECK(int(perm.size()) == x.rank(), "permute: {} axes given for a tensor of shape {}",
              perm.size(), x.shape());
  std::vector<int> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(x.shape().axis(perm[i]))] = int(i);
  for (int& p : perm) p = x.shape().axis(p);
  return record(
      "permute", {x}, kernels::permute(x, perm),
      [inverse](const Node&, const TensorList& g) { return TensorList{permute(g[0], inverse)}; });
}

Tensor transpose(const Tensor& x, int axis0, int axis1) {
  std::vector<int> perm(size_t(x.rank()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[size_t(x.shape().axis(axis0))], perm[size_t(x.shape().axis(axis1))]);
  return permute(x, perm);
}

namespace {
// The adjoint of slice: g placed at [start, start + len) of a zero tensor of
// shape `full` along `axis`. Its own gradient is the slice again.
Tensor unslice(const Tensor& g, const Shape& full, int axis, int64_t start) {
  Tensor out = Tensor::zeros(full, g.dtype(), g.device());
  kernels::slice_assign(out, g, axis, start);
  const int64_t len = g.dim(axis);
  return record("unslice", {g}, out, [axis, start, len](const Node&, const TensorList& gg) {
    return TensorList{slice(gg[0], axis, start, start + len)};
  });
}
}  // namespace

Tensor slice(const Tensor& x, int axis_in, int64_t start, int64_t end) {
  const int axis = x.shape().axis(axis_in);
  const int64_t n = x.dim(axis);
  if (start < 0) start += n;
  if (end < 0) end += n;
  REDCO_CHECK(0 <= start && start <= end && end <= n,
              "slice: [{}, {}) is out of range for axis {} of shape {}", start, end, axis,
              x.shape());
  return record("slice", {x}, kernels::slice(x, axis, start, end - start),
                [xs = x.shape(), axis, start](const Node&, const TensorList& g) {
                  return TensorList{unslice(g[0], xs, axis, start)};
                });
}

Tensor concat(const TensorList& xs, int axis_in) {
  REDCO_CHECK(!xs.empty(), "concat: no tensors given");
  const int axis = xs[0].shape().axis(axis_in);
  Shape out_shape = xs[0].shape();
  int64_t total = 0;
  std::vector<int64_t> starts;
  for (const Tensor& x : xs) {
    REDCO_CHECK(x.rank() == out_shape.rank() && x.shape().with(axis, 0) == out_shape.with(axis, 0),
                "concat: {} and {} differ outside axis {}", xs[0].shape(), x.shape(), axis);
    starts.push_back(total);
    total += x.dim(axis);
  }
  Tensor out = Tensor::empty(out_shape.with(axis, total), xs[0].dtype(), xs[0].device());
  for (size_t i = 0; i < xs.size(); ++i) kernels::slice_assign(out, xs[i], axis, starts[i]);
  starts.push_back(total);
  return record("concat", xs, out, [axis, starts](const Node& self, const TensorList& g) {
    TensorList grads(starts.size() - 1);
    for (size_t i = 0; i < grads.size(); ++i)
      if (self.needs_grad(int(i))) grads[i] = slice(g[0], axis, starts[i], starts[i + 1]);
    return grads;
  });
}

// One node with one output per part: its backward writes the parts'
// gradients into one buffer (zeros for a part that got none), instead of one
// zero-filled full-size buffer per part summed together.
TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int axis_in) {
  const int axis = x.shape().axis(axis_in);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  REDCO_CHECK(total == x.dim(axis), "split: sizes add up to {} but axis {} of {} has {}", total,
              axis, x.shape(), x.dim(axis));
  TensorList parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    REDCO_CHECK(s >= 0, "split: negative size {} for axis {} of {}", s, axis, x.shape());
    parts.push_back(kernels::slice(x, axis, start, s));
    start += s;
  }
  return record("split", {x}, std::move(parts),
                [axis](const Node&, const TensorList& g) { return TensorList{concat(g, axis)}; });
}

}  // namespace redco
