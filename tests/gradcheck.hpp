#pragma once
// Finite-difference gradient checks for differentiable ops.
// For f: inputs -> tensor, the scalar probe is L = sum(f(inputs) * r) with a
// fixed random r, so every output element contributes with its own weight.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "redco/autodiff/functional.hpp"

namespace redco::test {

using Fn = std::function<Tensor(const TensorList&)>;

// The largest elementwise difference of two tensors of one shape.
inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  float m = 0.f;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

inline Tensor randn(const Shape& s, uint64_t stream, float std = 1.f) {
  return Tensor::normal(s, 1234, stream, 0.f, std);
}

// L(inputs) = sum(f(inputs) * r), evaluated without recording.
inline double probe(const Fn& f, const TensorList& in, const Tensor& r) {
  NoGradGuard off;
  Tensor y = f(in);
  const float* a = y.data<float>();
  const float* b = r.data<float>();
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// Central differences of `scalar` w.r.t. element j of input i.
inline double central_difference(const std::function<double(const TensorList&)>& scalar,
                                 TensorList in, size_t i, int64_t j, float eps) {
  Tensor x = in[i].detach().clone();
  in[i] = x;
  float* p = x.data<float>();
  const float orig = p[j];
  p[j] = orig + eps;
  const double up = scalar(in);
  p[j] = orig - eps;
  const double down = scalar(in);
  p[j] = orig;
  return (up - down) / (2.0 * double(eps));
}

inline void expect_close(double analytic, double numeric, double atol, double rtol,
                         const std::string& where) {
  INFO(where << ": analytic " << analytic << " vs finite difference " << numeric);
  CHECK(std::abs(analytic - numeric) <= atol + rtol * std::abs(numeric));
}

// Checks the gradient of every floating input (listed in `wrt`) of f.
inline void check_gradients(const Fn& f, TensorList in, const std::vector<size_t>& wrt,
                            float eps = 1e-2f, double atol = 2e-3, double rtol = 1e-2) {
  for (size_t i : wrt) in[i] = in[i].detach().set_requires_grad(true);
  Tensor y = f(in);
  Tensor r = randn(y.shape(), 99);
  TensorList targets;
  for (size_t i : wrt) targets.push_back(in[i]);
  TensorList g = grad({sum(y * r)}, targets);
  auto scalar = [&](const TensorList& x) { return probe(f, x, r); };
  for (size_t t = 0; t < wrt.size(); ++t) {
    const float* ga = g[t].data<float>();
    for (int64_t j = 0; j < in[wrt[t]].numel(); ++j)
      expect_close(ga[j], central_difference(scalar, in, wrt[t], j, eps), atol, rtol,
                   "input " + std::to_string(wrt[t]) + " element " + std::to_string(j));
  }
}

// Second order: h(x) = <d L / d x_i, s> for a fixed random s; checks d h / d x_k
// (a Hessian-vector product, computed with create_graph) against finite
// differences of first-order gradients.
inline void check_second_order(const Fn& f, TensorList in, size_t i, const std::vector<size_t>& wrt,
                               float eps = 1e-2f, double atol = 5e-3, double rtol = 2e-2) {
  for (auto& x : in)
    if (is_floating(x.dtype())) x = x.detach().set_requires_grad(true);
  Tensor r = randn(f(in).shape(), 99);
  Tensor s = randn(in[i].shape(), 98);
  auto h = [&](const TensorList& x, bool create) {
    TensorList xs = x;
    for (auto& t : xs)
      if (is_floating(t.dtype())) t = t.detach().set_requires_grad(true);
    Tensor gi = grad({sum(f(xs) * r)}, {xs[i]}, {}, {.create_graph = create})[0];
    return std::make_pair(sum(gi * s), xs);
  };
  auto [hv, xs] = h(in, true);
  TensorList targets;
  for (size_t k : wrt) targets.push_back(xs[k]);
  TensorList hg = grad({hv}, targets, {}, {.allow_unused = true});
  auto scalar = [&](const TensorList& x) { return double(h(x, false).first.item()); };
  for (size_t t = 0; t < wrt.size(); ++t) {
    for (int64_t j = 0; j < in[wrt[t]].numel(); ++j) {
      const double a = hg[t].defined() ? hg[t].data<float>()[j] : 0.0;
      expect_close(
          a, central_difference(scalar, in, wrt[t], j, eps), atol, rtol,
          "second order, input " + std::to_string(wrt[t]) + " element " + std::to_string(j));
    }
  }
}

}  // namespace redco::test
