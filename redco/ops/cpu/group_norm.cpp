// Group norm and nearest upsampling on the CPU.
//
// A group-norm statistic covers one (sample, group) slab of (C/G)*S
// contiguous floats, so forward and dx parallelise over slabs like layer norm
// over rows. dgamma/dbeta reduce over the batch: each slab writes its own
// per-channel sums into a [N, C] scratch, and the batch is summed in order
// afterwards, so the gradients do not depend on the thread count.
#include "redco/ops/cpu/group_norm.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco::cpu {
namespace {

using CRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

constexpr int64_t kGrainElems = 16384;  // floats per TBB task, as for layer norm

void check(const char* op, const GroupNormGeometry& g) {
  REDCO_CHECK(g.N >= 0 && g.C >= 1 && g.S >= 1 && g.G >= 1 && g.C % g.G == 0,
              "{}: need C divisible by the groups, got N={} C={} S={} groups={}", op, g.N, g.C, g.S,
              g.G);
}

}  // namespace

void group_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, const GroupNormGeometry& g, float eps) {
  check("group_norm_forward", g);
  const int64_t D = g.row_size(), Cg = g.C / g.G;
  parallel_chunks(g.rows(), grain_for(kGrainElems, D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const CRow xr(x + r * D, D);
      // The corrected two-pass variance of layer_norm_forward (see norm.cpp).
      const float m0 = xr.sum() / float(D);
      const float c = (xr - m0).sum() / float(D);
      const float var = std::max((xr - m0).square().sum() / float(D) - c * c, 0.f);
      const float rs = 1.f / std::sqrt(var + eps), m = m0 + c;
      const int64_t c0 = (r % g.G) * Cg;  // first channel of this group
      for (int64_t k = 0; k < Cg; ++k) {
        // y = x * scale + shift per channel: one fused pass over S floats.
        const float scale = rs * gamma[c0 + k];
        const float shift = (beta ? beta[c0 + k] : 0.f) - m * scale;
        Row(y + r * D + k * g.S, g.S) = CRow(x + r * D + k * g.S, g.S) * scale + shift;
      }
      mean[r] = m;
      rstd[r] = rs;
    }
  });
}

void group_norm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, float* dx, float* dgamma, float* dbeta, float* partials,
                         const GroupNormGeometry& g) {
  check("group_norm_backward", g);
  const int64_t D = g.row_size(), Cg = g.C / g.G, NC = g.N * g.C;
  float* sxh = partials;       // [N, C]: sum over S of dy * xhat
  float* sdy = partials + NC;  // [N, C]: sum over S of dy
  parallel_chunks(g.rows(), grain_for(kGrainElems, D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float m = mean[r], rs = rstd[r];
      const int64_t c0 = (r % g.G) * Cg, nc0 = (r / g.G) * g.C + c0;
      float a = 0.f, b = 0.f;  // sums over the slab of dy*gamma and dy*gamma*xhat
      for (int64_t k = 0; k < Cg; ++k) {
        const CRow xs(x + r * D + k * g.S, g.S), dys(dy + r * D + k * g.S, g.S);
        sxh[nc0 + k] = (dys * (xs - m)).sum() * rs;
        sdy[nc0 + k] = dys.sum();
        a += gamma[c0 + k] * sdy[nc0 + k];
        b += gamma[c0 + k] * sxh[nc0 + k];
      }
      a /= float(D), b /= float(D);
      // dx = rstd * (dy * gamma - mean(dy * gamma) - xhat * mean(dy * gamma * xhat))
      for (int64_t k = 0; k < Cg; ++k) {
        const CRow xs(x + r * D + k * g.S, g.S), dys(dy + r * D + k * g.S, g.S);
        Row(dx + r * D + k * g.S, g.S) = rs * (dys * gamma[c0 + k] - a - (xs - m) * (rs * b));
      }
    }
  });
  for (int64_t c = 0; c < g.C; ++c) {  // over the batch, in order
    float sg = 0.f, sb = 0.f;
    for (int64_t n = 0; n < g.N; ++n) sg += sxh[n * g.C + c], sb += sdy[n * g.C + c];
    dgamma[c] = sg;
    if (dbeta) dbeta[c] = sb;
  }
}

void upsample_nearest2d_forward(const float* x, float* y, int64_t P, int64_t H, int64_t W,
                                int64_t f) {
  const int64_t OW = W * f, plane = H * W;
  parallel_chunks(P * H, grain_for(kGrainElems, OW * f), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {  // one input row -> f output rows
      const float* xr = x + r * W;
      float* y0 = y + (r / H) * plane * f * f + (r % H) * f * OW;
      for (int64_t w = 0; w < W; ++w)
        for (int64_t j = 0; j < f; ++j) y0[w * f + j] = xr[w];
      for (int64_t i = 1; i < f; ++i) std::copy(y0, y0 + OW, y0 + i * OW);
    }
  });
}

void upsample_nearest2d_backward(const float* dy, float* dx, int64_t P, int64_t H, int64_t W,
                                 int64_t f) {
  const int64_t OW = W * f, plane = H * W;
  parallel_chunks(P * H, grain_for(kGrainElems, OW * f), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* d0 = dy + (r / H) * plane * f * f + (r % H) * f * OW;
      float* dxr = dx + r * W;
      for (int64_t w = 0; w < W; ++w) {
        float s = 0.f;
        for (int64_t i = 0; i < f; ++i)
          for (int64_t j = 0; j < f; ++j) s += d0[i * OW + w * f + j];
        dxr[w] = s;
      }
    }
  });
}

}  // namespace redco::cpu
