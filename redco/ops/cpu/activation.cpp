// Pointwise GELU / SiLU and their derivatives.
//
// Large inputs are split into fixed-size chunks across oneTBB; each chunk runs
// Eigen array expressions, whose exp/erf are vectorised polynomial or rational
// approximations (a few ulp). Derivatives that need a transcendental
// twice evaluate it once into a small stack buffer per sub-block, so nothing is
// allocated and nothing is computed twice.
#include "redco/ops/cpu/activation.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <Eigen/Core>
#include <algorithm>
#include <unsupported/Eigen/SpecialFunctions>

#include "redco/core/error.hpp"

namespace redco::cpu {
namespace {

using CVec = Eigen::Map<const Eigen::ArrayXf>;
using Vec = Eigen::Map<Eigen::ArrayXf>;

// Floats per TBB task at minimum (64 KiB of input); smaller n runs serially.
constexpr int64_t kGrainElems = 16384;
// Sub-block for the stack buffer of a shared intermediate (4 KiB, stays in L1).
constexpr int64_t kSub = 1024;

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;    // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)

// Calls f(begin, len) over [0, n) in chunks of at least kGrainElems.
template <typename F>
void for_chunks(const char* op, int64_t n, const F& f) {
  REDCO_CHECK(n >= 0, "{}: element count must be >= 0, got {}", op, n);
  if (n <= kGrainElems) {
    if (n > 0) f(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrainElems),
                    [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.size()); });
}

// Calls f(begin, len) over [b, b + len) in sub-blocks of at most kSub.
template <typename F>
void for_sub_blocks(int64_t b, int64_t len, const F& f) {
  for (int64_t j = b; j < b + len; j += kSub) f(j, std::min(kSub, b + len - j));
}

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx) {
  for_chunks("gelu_forward", n, [&](int64_t b, int64_t len) {
    const CVec xv(x + b, len);
    Vec yv(y + b, len);
    if (tanh_approx) {
      // 0.5 (1 + tanh(u)) == sigmoid(2u) == 1 / (1 + exp(-2u)). Unlike 1 + tanh(u)
      // this has no cancellation for x < 0, and exp overflowing to inf gives
      // x / inf = -0, the correct limit.
      yv = xv / (1.f + (-2.f * kSqrt2OverPi * (xv + kGeluCubic * xv.cube())).exp());
    } else {
      yv = 0.5f * xv * (1.f + (xv * kInvSqrt2).erf());
    }
  });
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx) {
  for_chunks("gelu_backward", n, [&](int64_t b0, int64_t len0) {
    if (!tanh_approx) {
      // d/dx [x Phi(x)] = Phi(x) + x phi(x); exp(-x^2/2) underflows to 0 for
      // large |x|, and Phi saturates to 0 or 1, so no inf/NaN can appear.
      const CVec xv(x + b0, len0);
      Vec(dx + b0, len0) = CVec(dy + b0, len0) * (0.5f * (1.f + (xv * kInvSqrt2).erf()) +
                                                  xv * kInvSqrt2Pi * (-0.5f * xv.square()).exp());
      return;
    }
    for_sub_blocks(b0, len0, [&](int64_t b, int64_t len) {
      float ebuf[kSub], sbuf[kSub];
      const CVec xv(x + b, len);
      // With s = sigmoid(2u), u = sqrt(2/pi) (x + c x^3), e = exp(-2u):
      //   d/dx = s + 2 x s (1 - s) u',  s (1 - s) = s^2 e,  u' = sqrt(2/pi) (1 + 3c x^2).
      // s^2 e has no 1 - s cancellation, and is exactly 0 when e underflows. The
      // fast tanh would instead saturate a few ulp short of 1 at |u| = 8, leaving
      // a 1 - t^2 ~ 1e-7 that x u' (~x^3) blows up for large |x|. The exponent is
      // capped at 80 so e stays finite (s^2 e would be 0 * inf for x << 0).
      Vec e(ebuf, len);  // [len] exp(-2u)
      e = (-2.f * kSqrt2OverPi * (xv + kGeluCubic * xv.cube())).min(80.f).exp();
      Vec s(sbuf, len);  // [len] sigmoid(2u)
      s = 1.f / (1.f + e);
      Vec(dx + b, len) = CVec(dy + b, len) * (s + 2.f * xv * (s.square() * e) * kSqrt2OverPi *
                                                      (1.f + 3.f * kGeluCubic * xv.square()));
    });
  });
}

void silu_forward(const float* x, float* y, int64_t n) {
  for_chunks("silu_forward", n, [&](int64_t b, int64_t len) {
    const CVec xv(x + b, len);
    // exp(-x) may overflow to inf for x << 0; x / inf is then -0, the right limit.
    Vec(y + b, len) = xv / (1.f + (-xv).exp());
  });
}

void silu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  for_chunks("silu_backward", n, [&](int64_t b0, int64_t len0) {
    for_sub_blocks(b0, len0, [&](int64_t b, int64_t len) {
      float sbuf[kSub];
      const CVec xv(x + b, len);
      Vec s(sbuf, len);  // [len] sigmoid(x)
      s = 1.f / (1.f + (-xv).exp());
      // d/dx [x s(x)] = s (1 + x (1 - s))
      Vec(dx + b, len) = CVec(dy + b, len) * s * (1.f + xv * (1.f - s));
    });
  });
}

}  // namespace redco::cpu
