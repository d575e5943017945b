// Ghost norms: Gram-matrix products per example, batched as [B, T, T] GEMMs.
#include "redco/privacy/per_example.hpp"

#include <algorithm>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/conv.hpp"

namespace redco::privacy {
namespace {

// Elements of per-example gradients formed at once on the direct path (64 MiB).
constexpr int64_t kDirectChunkElems = int64_t(1) << 24;

// sum_{t,t'} (a_t . a_t')(g_t . g_t') per example, or ||G_b||^2 with G_b formed
// a few examples at a time when that is smaller. Layouts: a [B, T, m] and
// g [B, T, n] (positions first), or a [B, m, T] and g [B, n, T] (features
// first, as im2col lays out patches); the GEMMs' transpose flags follow, so
// no operand is copied into the other layout.
Tensor gram_norms(const Tensor& a, const Tensor& g, bool features_first) {
  const bool ff = features_first;
  const int64_t B = a.dim(0), T = a.dim(ff ? 2 : 1), m = a.dim(ff ? 1 : 2), n = g.dim(ff ? 1 : 2);
  if (2 * T * T <= m * n) return sum(matmul(a, a, ff, !ff) * matmul(g, g, ff, !ff), {1, 2});
  const int64_t chunk = std::max<int64_t>(1, kDirectChunkElems / (m * n));
  TensorList parts;
  for (int64_t b = 0; b < B; b += chunk) {
    const int64_t e = std::min(B, b + chunk);
    // G [chunk, n, m] = g^T a (positions first) or g a^T (features first).
    parts.push_back(sum(square(matmul(g.slice0(b, e), a.slice0(b, e), !ff, ff)), {1, 2}));
  }
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

void check_float(const char* fn, const char* what, const Tensor& t) {
  REDCO_CHECK(t.defined() && t.dtype() == DType::f32,
              "privacy::{}: {} must be a defined f32 tensor", fn, what);
}

}  // namespace

Tensor linear_weight_grad_sq_norms(const Tensor& input, const Tensor& grad_output) {
  constexpr const char* fn = "linear_weight_grad_sq_norms";
  check_float(fn, "input", input);
  check_float(fn, "grad_output", grad_output);
  const Shape &a = input.shape(), &g = grad_output.shape();
  REDCO_CHECK((a.rank() == 2 || a.rank() == 3) && g.rank() == a.rank() && a[0] == g[0] &&
                  (a.rank() == 2 || a[1] == g[1]),
              "privacy::{}: input {} and grad_output {} must be [B, in] and [B, out], or "
              "[B, T, in] and [B, T, out]",
              fn, a, g);
  GradModeGuard off(false);
  if (a.rank() == 2) return sum(square(input), {1}) * sum(square(grad_output), {1});
  return gram_norms(input, grad_output, /*features_first=*/false);
}

Tensor linear_bias_grad_sq_norms(const Tensor& grad_output) {
  check_float("linear_bias_grad_sq_norms", "grad_output", grad_output);
  const int r = grad_output.rank();
  REDCO_CHECK(r == 2 || r == 3,
              "privacy::linear_bias_grad_sq_norms: grad_output {} must be [B, out] or [B, T, out]",
              grad_output.shape());
  GradModeGuard off(false);
  const Tensor per_example = r == 2 ? grad_output : sum(grad_output, {1});
  return sum(square(per_example), {1});
}

Tensor embedding_grad_sq_norms(const Tensor& ids, const Tensor& grad_output) {
  check_float("embedding_grad_sq_norms", "grad_output", grad_output);
  REDCO_CHECK(ids.defined() && ids.dtype() == DType::i64 && ids.rank() == 2 &&
                  grad_output.rank() == 3 && grad_output.dim(0) == ids.dim(0) &&
                  grad_output.dim(1) == ids.dim(1),
              "privacy::embedding_grad_sq_norms: ids {} must be i64 [B, T] and grad_output {} "
              "[B, T, D]",
              ids.defined() ? ids.shape() : Shape{}, grad_output.shape());
  GradModeGuard off(false);
  const int64_t B = ids.dim(0), T = ids.dim(1);
  // same[b, t, t'] = 1 where ids[b, t] == ids[b, t']: rows of the table that
  // two positions both update.
  const Tensor same = equal(ids.view({B, T, 1}), ids.view({B, 1, T}));
  return sum(matmul(grad_output, grad_output, false, true) * same, {1, 2});
}

namespace {

// Checks a conv2d's x [N, C, H, W] and grad_output [N, O, OH, OW] against the
// kernel; returns the geometry.
cpu::Conv2dGeometry conv_geometry(const char* fn, const Tensor& x, const Tensor& grad_output,
                                  int64_t kh, int64_t kw, int64_t stride, int64_t pad) {
  check_float(fn, "x", x);
  check_float(fn, "grad_output", grad_output);
  REDCO_CHECK(x.rank() == 4 && grad_output.rank() == 4 && x.dim(0) == grad_output.dim(0),
              "privacy::{}: x {} must be [N, C, H, W] and grad_output {} [N, O, OH, OW]", fn,
              x.shape(), grad_output.shape());
  const cpu::Conv2dGeometry geo{x.dim(0), x.dim(1), x.dim(2), x.dim(3), grad_output.dim(1),
                                kh,       kw,       stride,   pad};
  REDCO_CHECK(kh >= 1 && kw >= 1 && stride >= 1 && pad >= 0 && geo.out_h() == grad_output.dim(2) &&
                  geo.out_w() == grad_output.dim(3),
              "privacy::{}: grad_output {} does not fit x {} with a {}x{} kernel, stride {}, "
              "pad {} (expected [{}, {}, {}, {}])",
              fn, grad_output.shape(), x.shape(), kh, kw, stride, pad, geo.N, geo.O, geo.out_h(),
              geo.out_w());
  REDCO_CHECK(x.device() == Device::cpu() && grad_output.device() == Device::cpu(),
              "privacy::{}: implemented for CPU tensors (im2col), got x on {}", fn,
              x.device().str());
  return geo;
}

}  // namespace

Tensor conv2d_weight_grad_sq_norms(const Tensor& x, const Tensor& grad_output, int64_t kh,
                                   int64_t kw, int64_t stride, int64_t pad) {
  const auto geo =
      conv_geometry("conv2d_weight_grad_sq_norms", x, grad_output, kh, kw, stride, pad);
  GradModeGuard off(false);
  const int64_t L = geo.out_h() * geo.out_w(), K = geo.C * kh * kw;
  Tensor cols = Tensor::empty({geo.N, K, L});  // patches, features first: [N, C*kh*kw, OH*OW]
  cpu::im2col(x.data<float>(), cols.data<float>(), geo);
  // G_n = g_n [O, L] @ cols_n^T [L, K]: a linear layer applied at L positions.
  return gram_norms(cols, grad_output.view({geo.N, geo.O, L}), /*features_first=*/true);
}

Tensor conv2d_bias_grad_sq_norms(const Tensor& grad_output) {
  check_float("conv2d_bias_grad_sq_norms", "grad_output", grad_output);
  REDCO_CHECK(grad_output.rank() == 4,
              "privacy::conv2d_bias_grad_sq_norms: grad_output {} must be [N, O, OH, OW]",
              grad_output.shape());
  GradModeGuard off(false);
  return sum(square(sum(grad_output, {2, 3})), {1});
}

Tensor clip_factors(const Tensor& sq_norms, float max_norm) {
  REDCO_CHECK(max_norm > 0, "privacy::clip_factors: max_norm must be > 0, got {}", max_norm);
  REDCO_CHECK(sq_norms.defined() && sq_norms.rank() == 1,
              "privacy::clip_factors: squared norms must be [B], got {}",
              sq_norms.defined() ? sq_norms.shape() : Shape{});
  GradModeGuard off(false);
  const Tensor f = max_norm / (sqrt(sq_norms) + 1e-6f);
  return 1.f - relu(1.f - f);  // min(1, f)
}

Tensor clipped_linear_weight_grad(const Tensor& input, const Tensor& grad_output,
                                  const Tensor& factors) {
  constexpr const char* fn = "clipped_linear_weight_grad";
  check_float(fn, "input", input);
  check_float(fn, "grad_output", grad_output);
  const int r = input.rank();
  REDCO_CHECK((r == 2 || r == 3) && grad_output.rank() == r && input.dim(0) == grad_output.dim(0) &&
                  factors.defined() && factors.shape() == Shape{input.dim(0)},
              "privacy::{}: input {}, grad_output {} and factors {} must be [B(, T), in], "
              "[B(, T), out] and [B]",
              fn, input.shape(), grad_output.shape(),
              factors.defined() ? factors.shape() : Shape{});
  GradModeGuard off(false);
  const int64_t B = input.dim(0), in = input.dim(r - 1), out = grad_output.dim(r - 1);
  const Tensor scaled = grad_output * (r == 2 ? factors.view({B, 1}) : factors.view({B, 1, 1}));
  return matmul(reshape(scaled, {-1, out}), reshape(input, {-1, in}), true, false);
}

Tensor clipped_linear_bias_grad(const Tensor& grad_output, const Tensor& factors) {
  check_float("clipped_linear_bias_grad", "grad_output", grad_output);
  const int r = grad_output.rank();
  REDCO_CHECK(
      (r == 2 || r == 3) && factors.defined() && factors.shape() == Shape{grad_output.dim(0)},
      "privacy::clipped_linear_bias_grad: grad_output {} and factors {} must be "
      "[B(, T), out] and [B]",
      grad_output.shape(), factors.defined() ? factors.shape() : Shape{});
  GradModeGuard off(false);
  const int64_t B = grad_output.dim(0);
  if (r == 2) return sum(grad_output * factors.view({B, 1}), {0});
  return sum(grad_output * factors.view({B, 1, 1}), {0, 1});
}

Tensor clipped_conv2d_weight_grad(const Tensor& x, const Tensor& grad_output, const Tensor& factors,
                                  int64_t kh, int64_t kw, int64_t stride, int64_t pad) {
  const auto geo = conv_geometry("clipped_conv2d_weight_grad", x, grad_output, kh, kw, stride, pad);
  REDCO_CHECK(factors.defined() && factors.shape() == Shape{geo.N},
              "privacy::clipped_conv2d_weight_grad: factors {} must be [N] = [{}]",
              factors.defined() ? factors.shape() : Shape{}, geo.N);
  GradModeGuard off(false);
  // The convolution's own weight gradient of the per-example-scaled output
  // gradient (no input gradient: w is not needed).
  const Tensor dy = grad_output * factors.view({geo.N, 1, 1, 1});
  Tensor dw = Tensor::empty({geo.O, geo.C, kh, kw});
  Tensor cols = Tensor::empty({geo.N, geo.C * kh * kw, geo.out_h() * geo.out_w()});  // scratch
  cpu::conv2d_backward(dy.data<float>(), x.data<float>(), nullptr, nullptr, dw.data<float>(),
                       nullptr, cols.data<float>(), geo);
  return dw;
}

Tensor clipped_conv2d_bias_grad(const Tensor& grad_output, const Tensor& factors) {
  check_float("clipped_conv2d_bias_grad", "grad_output", grad_output);
  REDCO_CHECK(
      grad_output.rank() == 4 && factors.defined() && factors.shape() == Shape{grad_output.dim(0)},
      "privacy::clipped_conv2d_bias_grad: grad_output {} and factors {} must be "
      "[N, O, OH, OW] and [N]",
      grad_output.shape(), factors.defined() ? factors.shape() : Shape{});
  GradModeGuard off(false);
  return sum(grad_output * factors.view({grad_output.dim(0), 1, 1, 1}), {0, 2, 3});
}

}  // namespace redco::privacy
