// Rotary position embeddings with the frequency variants of real checkpoints.
#include "redco/nn/rope.hpp"

#include <cmath>
#include <numbers>

#include "redco/core/error.hpp"

namespace redco::nn {

std::vector<double> rope_inv_freq(const RopeOptions& o, int64_t head_dim) {
  const int64_t r = o.rotary_dim ? o.rotary_dim : head_dim;
  REDCO_CHECK(r > 0 && r % 2 == 0 && r <= head_dim,
              "rotary: rotary_dim {} must be even and at most the head size {}", r, head_dim);
  REDCO_CHECK(o.base > 0.f, "rotary: the base (rope_theta) must be positive, got {}", o.base);
  std::vector<double> f(size_t(r / 2));
  for (int64_t i = 0; i < r / 2; ++i)
    f[size_t(i)] = std::pow(double(o.base), -2.0 * double(i) / double(r));
  if (o.scaling == RopeScaling::linear) {
    REDCO_CHECK(o.factor > 0.f, "rope_scaling: factor must be positive, got {}", o.factor);
    for (double& v : f) v /= o.factor;
  } else if (o.scaling == RopeScaling::llama3) {
    REDCO_CHECK(o.factor > 0.f && o.high_freq_factor > o.low_freq_factor,
                "rope_scaling (llama3): needs factor > 0 and high_freq_factor > low_freq_factor");
    const double old_len = double(o.original_max_positions);
    const double low_wavelen = old_len / o.low_freq_factor,
                 high_wavelen = old_len / o.high_freq_factor;
    for (double& v : f) {
      const double wavelen = 2 * std::numbers::pi / v;
      if (wavelen > low_wavelen) {
        v /= o.factor;                       // long wavelengths: interpolated
      } else if (wavelen >= high_wavelen) {  // between: a smooth ramp
        const double smooth =
            (old_len / wavelen - o.low_freq_factor) / (o.high_freq_factor - o.low_freq_factor);
        v = (1 - smooth) * v / o.factor + smooth * v;
      }
    }
  }
  return f;
}

Tensor apply_rope(const Tensor& x, int64_t pos_offset, const RopeOptions& o) {
  REDCO_CHECK(x.rank() == 4, "rotary: expected [batch, heads, seq, head_dim], got {}", x.shape());
  const int64_t D = x.dim(3), T = x.dim(2), r = o.rotary_dim ? o.rotary_dim : D;
  if (r == D && o.scaling == RopeScaling::none) return rotary(x, pos_offset, o.base);
  const std::vector<double> f = rope_inv_freq(o, D);
  const int64_t half = r / 2;
  // cos/sin [T, r/2], angles in double (see ops/cpu/rotary.cpp for why).
  Tensor c = Tensor::empty(Shape{T, half}), s = Tensor::empty(Shape{T, half});
  float *cp = c.data<float>(), *sp = s.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(pos_offset + t) * f[size_t(i)];
      cp[t * half + i] = float(std::cos(a)), sp[t * half + i] = float(std::sin(a));
    }
  if (!x.device().is_cpu()) c = c.to(x.device()), s = s.to(x.device());
  const Tensor x1 = slice(x, 3, 0, half), x2 = slice(x, 3, half, r);
  TensorList parts{x1 * c - x2 * s, x2 * c + x1 * s};
  if (r < D) parts.push_back(slice(x, 3, r, D));
  return concat(parts, 3);
}

void fill_rope_table(RopeTable& t, std::span<const int64_t> start, int64_t T, int64_t head_dim,
                     const RopeOptions& o) {
  const std::vector<double> f = rope_inv_freq(o, head_dim);
  t.B = int64_t(start.size()), t.T = T, t.half = int64_t(f.size());
  t.cos.resize(size_t(t.B * T * t.half));
  t.sin.resize(t.cos.size());
  for (int64_t b = 0; b < t.B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < t.half; ++j) {
        const double a = double(start[size_t(b)] + i) * f[size_t(j)];
        const size_t at = size_t((b * T + i) * t.half + j);
        t.cos[at] = float(std::cos(a)), t.sin[at] = float(std::sin(a));
      }
}

Tensor apply_rope_table(const Tensor& x_in, const RopeTable& t) {
  REDCO_CHECK(!GradMode::enabled() || !x_in.requires_grad(),
              "rotary with a position table is for generation: run it without gradients");
  const Tensor x = x_in.to(Device::cpu()).to(DType::f32);
  REDCO_CHECK(x.rank() == 4 && x.dim(0) == t.B && x.dim(2) == t.T && 2 * t.half <= x.dim(3),
              "rotary: x {} does not fit a table of {} rows x {} positions", x.shape(), t.B, t.T);
  const int64_t H = x.dim(1), D = x.dim(3), half = t.half;
  Tensor y = x.clone();
  float* p = y.data<float>();
  for (int64_t b = 0; b < t.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < t.T; ++i) {
        float* row = p + ((b * H + h) * t.T + i) * D;
        const float* c = t.cos.data() + (b * t.T + i) * half;
        const float* s = t.sin.data() + (b * t.T + i) * half;
        for (int64_t j = 0; j < half; ++j) {
          const float x1 = row[j], x2 = row[j + half];
          row[j] = x1 * c[j] - x2 * s[j];
          row[j + half] = x2 * c[j] + x1 * s[j];
        }
      }
  return x_in.device().is_cpu() ? y : y.to(x_in.device());
}

}  // namespace redco::nn
