// 2-D convolution (im2col + GEMM) and pooling on the CPU, NCHW.
#include "redco/ops/cpu/conv.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/gemm.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco::cpu {
namespace {

// A parallel task should do at least this much work (floats moved or
// multiply-adds), so tiny layers and single images stay on the calling thread.
constexpr int64_t kGrainWork = 64 * 1024;

// Partial dw buffers of conv2d_backward may use at most this many floats.
constexpr int64_t kPartialBudget = 16 * 1024 * 1024;
constexpr int64_t kMaxPartials = 32;

int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kGrainWork / std::max<int64_t>(1, work_per_item));
}

void check_conv(const char* op, const Conv2dGeometry& g) {
  REDCO_CHECK(g.N >= 0 && g.C >= 1 && g.H >= 1 && g.W >= 1 && g.O >= 1 && g.KH >= 1 && g.KW >= 1,
              "{}: bad shape x [N={}, C={}, H={}, W={}], w [O={}, C, KH={}, KW={}]", op, g.N, g.C,
              g.H, g.W, g.O, g.KH, g.KW);
  REDCO_CHECK(g.stride >= 1 && g.pad >= 0, "{}: need stride >= 1 and pad >= 0, got {} and {}", op,
              g.stride, g.pad);
  REDCO_CHECK(g.H + 2 * g.pad >= g.KH && g.W + 2 * g.pad >= g.KW,
              "{}: kernel {}x{} is larger than the padded {}x{} image", op, g.KH, g.KW,
              g.H + 2 * g.pad, g.W + 2 * g.pad);
}

void check_pool(const char* op, const Pool2dGeometry& g) {
  REDCO_CHECK(g.N >= 0 && g.C >= 0 && g.K >= 1 && g.stride >= 1,
              "{}: bad geometry N={}, C={}, K={}, stride={}", op, g.N, g.C, g.K, g.stride);
  REDCO_CHECK(g.H >= g.K && g.W >= g.K, "{}: window {} is larger than the {}x{} image", op, g.K,
              g.H, g.W);
  REDCO_CHECK(g.H * g.W <= std::numeric_limits<int32_t>::max(),
              "{}: {}x{} plane too large for int32 argmax", op, g.H, g.W);
}

// Output columns ow whose input column ow*stride - pad + kw lies in [0, W):
// the half-open range [lo, hi). Lets the inner loops run without bounds tests.
struct Span {
  int64_t lo, hi;
};
Span valid_ow(const Conv2dGeometry& g, int64_t kw, int64_t OW) {
  const int64_t first = g.pad - kw;  // smallest in-range ow satisfies ow*stride >= first
  const int64_t lo = first <= 0 ? 0 : (first + g.stride - 1) / g.stride;
  const int64_t last = g.W - 1 + g.pad - kw;  // largest satisfies ow*stride <= last
  const int64_t hi = last < 0 ? 0 : std::min(OW, last / g.stride + 1);
  return {std::min(lo, hi), hi};
}

// One channel: x_c [H, W] -> cols_c [KH*KW, OH*OW] (the rows of channel c).
void im2col_channel(const float* x_c, float* cols_c, const Conv2dGeometry& g) {
  const int64_t OH = g.out_h(), OW = g.out_w();
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      float* row = cols_c + (kh * g.KW + kw) * OH * OW;  // [OH, OW]
      const Span s = valid_ow(g, kw, OW);
      for (int64_t oh = 0; oh < OH; ++oh) {
        float* dst = row + oh * OW;
        const int64_t ih = oh * g.stride - g.pad + kh;
        if (ih < 0 || ih >= g.H) {
          std::fill(dst, dst + OW, 0.f);
          continue;
        }
        const float* src = x_c + ih * g.W;  // [W], input row ih
        const int64_t off = kw - g.pad;     // iw = ow*stride + off
        std::fill(dst, dst + s.lo, 0.f);
        for (int64_t ow = s.lo; ow < s.hi; ++ow) dst[ow] = src[ow * g.stride + off];
        std::fill(dst + s.hi, dst + OW, 0.f);
      }
    }
  }
}

// Adjoint of im2col_channel: dx_c [H, W] = sum of cols_c entries mapping to it.
void col2im_channel(const float* cols_c, float* dx_c, const Conv2dGeometry& g) {
  const int64_t OH = g.out_h(), OW = g.out_w();
  std::fill(dx_c, dx_c + g.H * g.W, 0.f);
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const float* row = cols_c + (kh * g.KW + kw) * OH * OW;  // [OH, OW]
      const Span s = valid_ow(g, kw, OW);
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t ih = oh * g.stride - g.pad + kh;
        if (ih < 0 || ih >= g.H) continue;
        const float* src = row + oh * OW;
        float* dst = dx_c + ih * g.W;    // [W], input row ih
        const int64_t off = kw - g.pad;  // iw = ow*stride + off
        for (int64_t ow = s.lo; ow < s.hi; ++ow) dst[ow * g.stride + off] += src[ow];
      }
    }
  }
}

// Single image: x_n [C, H, W] <-> cols_n [C*KH*KW, OH*OW].
void im2col_image(const float* x_n, float* cols_n, const Conv2dGeometry& g) {
  const int64_t plane_cols = g.KH * g.KW * g.out_h() * g.out_w();
  for (int64_t c = 0; c < g.C; ++c) im2col_channel(x_n + c * g.H * g.W, cols_n + c * plane_cols, g);
}
void col2im_image(const float* cols_n, float* dx_n, const Conv2dGeometry& g) {
  const int64_t plane_cols = g.KH * g.KW * g.out_h() * g.out_w();
  for (int64_t c = 0; c < g.C; ++c)
    col2im_channel(cols_n + c * plane_cols, dx_n + c * g.H * g.W, g);
}

}  // namespace

// Both parallelise over (image, channel) planes: each writes a disjoint slice.
void im2col(const float* x, float* cols, const Conv2dGeometry& g) {
  check_conv("im2col", g);
  const int64_t plane_cols = g.KH * g.KW * g.out_h() * g.out_w();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.N * g.C, grain_for(plane_cols)),
                    [&](const auto& r) {
                      for (int64_t p = r.begin(); p < r.end(); ++p)
                        im2col_channel(x + p * g.H * g.W, cols + p * plane_cols, g);
                    });
}

void col2im(const float* cols, float* dx, const Conv2dGeometry& g) {
  check_conv("col2im", g);
  const int64_t plane_cols = g.KH * g.KW * g.out_h() * g.out_w();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.N * g.C, grain_for(plane_cols)),
                    [&](const auto& r) {
                      for (int64_t p = r.begin(); p < r.end(); ++p)
                        col2im_channel(cols + p * plane_cols, dx + p * g.H * g.W, g);
                    });
}

// Parallel over images, one im2col + one GEMM per image, rather than one big
// GEMM: cols is laid out [N, CKK, OHW], so a single GEMM would produce
// [O, N*OHW] and need a transpose back to NCHW, whereas the per-image GEMM
// y_n [O, OHW] = w [O, CKK] x cols_n [CKK, OHW] writes NCHW directly. It also
// consumes cols_n right after building it, while it is still in cache
// (CKK*OHW = 576*784 floats = 1.8 MB for a 64-channel 3x3 layer on 28x28), and
// the batch gives the parallelism without relying on a threaded GEMM.
void conv2d_forward(const float* x, const float* w, const float* bias, float* y, float* cols,
                    const Conv2dGeometry& g) {
  check_conv("conv2d_forward", g);
  const int64_t ohw = g.out_h() * g.out_w(), ckk = g.C * g.KH * g.KW;
  const int64_t chw = g.C * g.H * g.W;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, g.N, grain_for(g.O * ckk * ohw)), [&](const auto& r) {
        for (int64_t n = r.begin(); n < r.end(); ++n) {
          float* cols_n = cols + n * ckk * ohw;  // [CKK, OHW]
          float* y_n = y + n * g.O * ohw;        // [O, OHW]
          im2col_image(x + n * chw, cols_n, g);
          // The bias is preloaded into y_n so the GEMM adds onto it (beta = 1).
          if (bias != nullptr) {
            for (int64_t o = 0; o < g.O; ++o)
              std::fill(y_n + o * ohw, y_n + (o + 1) * ohw, bias[o]);
          }
          sgemm(false, false, g.O, ohw, ckk, 1.f, w, ckk, cols_n, ohw, bias ? 1.f : 0.f, y_n, ohw);
        }
      });
}

// dw sums over images, a reduction. To keep it deterministic (independent of
// thread scheduling) the batch is cut into a FIXED number of contiguous chunks,
// chosen from the geometry only; each chunk accumulates its images in order
// into its own partial [O, CKK] (chunk 0 uses dw itself), and the partials are
// summed in chunk order at the end. Within a chunk, each image also does its
// dx work (dcols_n = w^T dy_n, then col2im) while its data is in cache.
void conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* dbias, float* cols, const Conv2dGeometry& g) {
  check_conv("conv2d_backward", g);
  const int64_t ohw = g.out_h() * g.out_w(), ckk = g.C * g.KH * g.KW;
  const int64_t chw = g.C * g.H * g.W, wsize = g.O * ckk;
  if (g.N == 0) {  // no images: zero gradients
    std::fill(dw, dw + wsize, 0.f);
    if (dbias != nullptr) std::fill(dbias, dbias + g.O, 0.f);
    return;
  }
  const int64_t nchunks = std::clamp<int64_t>(
      std::min({g.N, kMaxPartials, kPartialBudget / wsize, g.N * g.O * ckk * ohw / kGrainWork}), 1,
      g.N);
  AlignedFloats partials(static_cast<size_t>((nchunks - 1) * wsize));  // [nchunks-1, O, CKK]
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, nchunks, 1),
      [&](const auto& r) {
        for (int64_t ch = r.begin(); ch < r.end(); ++ch) {
          float* dw_ch = ch == 0 ? dw : partials.data() + (ch - 1) * wsize;  // [O, CKK]
          const int64_t n0 = g.N * ch / nchunks, n1 = g.N * (ch + 1) / nchunks;
          for (int64_t n = n0; n < n1; ++n) {
            float* cols_n = cols + n * ckk * ohw;    // [CKK, OHW]
            const float* dy_n = dy + n * g.O * ohw;  // [O, OHW]
            im2col_image(x + n * chw, cols_n, g);
            // dw_ch [O, CKK] (+)= dy_n [O, OHW] x cols_n^T [OHW, CKK]
            sgemm(false, true, g.O, ckk, ohw, 1.f, dy_n, ohw, cols_n, ohw, n == n0 ? 0.f : 1.f,
                  dw_ch, ckk);
            if (dx == nullptr) continue;
            // dcols_n [CKK, OHW] = w^T [CKK, O] x dy_n [O, OHW], reusing cols_n.
            sgemm(true, false, ckk, ohw, g.O, 1.f, w, ckk, dy_n, ohw, 0.f, cols_n, ohw);
            col2im_image(cols_n, dx + n * chw, g);
          }
        }
      },
      tbb::simple_partitioner());
  if (nchunks > 1) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, wsize, grain_for(nchunks)),
                      [&](const auto& r) {
                        for (int64_t j = r.begin(); j < r.end(); ++j) {
                          float s = dw[j];
                          for (int64_t ch = 1; ch < nchunks; ++ch)
                            s += partials[(ch - 1) * wsize + j];
                          dw[j] = s;
                        }
                      });
  }
  if (dbias == nullptr) return;
  // dbias[o] = sum over n, hw of dy; accumulated in double, one task per channel.
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.O, grain_for(g.N * ohw)), [&](const auto& r) {
    for (int64_t o = r.begin(); o < r.end(); ++o) {
      double s = 0;
      for (int64_t n = 0; n < g.N; ++n) {
        const float* dy_no = dy + (n * g.O + o) * ohw;
        for (int64_t k = 0; k < ohw; ++k) s += dy_no[k];
      }
      dbias[o] = static_cast<float>(s);
    }
  });
}

// ---------------------------------------------------------------- pooling
// All pooling kernels parallelise over (image, channel) planes; each plane's
// input and output slices are disjoint, so backward needs no synchronisation
// even when windows overlap (stride < K), and sums are in a fixed order.

void max_pool2d_forward(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) {
  check_pool("max_pool2d_forward", g);
  const int64_t OH = g.out_h(), OW = g.out_w(), hw = g.H * g.W;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.N * g.C, grain_for(hw)), [&](const auto& r) {
    for (int64_t p = r.begin(); p < r.end(); ++p) {
      const float* xp = x + p * hw;  // [H, W]
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t best_i = oh * g.stride * g.W + ow * g.stride;
          float best = xp[best_i];
          for (int64_t kh = 0; kh < g.K; ++kh) {
            for (int64_t kw = 0; kw < g.K; ++kw) {
              const int64_t i = (oh * g.stride + kh) * g.W + ow * g.stride + kw;
              // First maximum wins ties; a NaN wins (propagates), like PyTorch.
              if (xp[i] > best || (std::isnan(xp[i]) && !std::isnan(best))) {
                best = xp[i];
                best_i = i;
              }
            }
          }
          y[(p * OH + oh) * OW + ow] = best;
          argmax[(p * OH + oh) * OW + ow] = static_cast<int32_t>(best_i);
        }
      }
    }
  });
}

void max_pool2d_backward(const float* dy, const int32_t* argmax, float* dx,
                         const Pool2dGeometry& g) {
  check_pool("max_pool2d_backward", g);
  const int64_t ohw = g.out_h() * g.out_w(), hw = g.H * g.W;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.N * g.C, grain_for(hw)), [&](const auto& r) {
    for (int64_t p = r.begin(); p < r.end(); ++p) {
      float* dxp = dx + p * hw;  // [H, W]
      std::fill(dxp, dxp + hw, 0.f);
      for (int64_t k = 0; k < ohw; ++k) dxp[argmax[p * ohw + k]] += dy[p * ohw + k];
    }
  });
}

void avg_pool2d_forward(const float* x, float* y, const Pool2dGeometry& g) {
  check_pool("avg_pool2d_forward", g);
  const int64_t OH = g.out_h(), OW = g.out_w(), hw = g.H * g.W;
  const float scale = 1.f / static_cast<float>(g.K * g.K);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.N * g.C, grain_for(hw)), [&](const auto& r) {
    for (int64_t p = r.begin(); p < r.end(); ++p) {
      const float* xp = x + p * hw;  // [H, W]
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          const float* win = xp + oh * g.stride * g.W + ow * g.stride;
          float s = 0.f;
          for (int64_t kh = 0; kh < g.K; ++kh)
            for (int64_t kw = 0; kw < g.K; ++kw) s += win[kh * g.W + kw];
          y[(p * OH + oh) * OW + ow] = s * scale;
        }
      }
    }
  });
}

void avg_pool2d_backward(const float* dy, float* dx, const Pool2dGeometry& g) {
  check_pool("avg_pool2d_backward", g);
  const int64_t OH = g.out_h(), OW = g.out_w(), hw = g.H * g.W;
  const float scale = 1.f / static_cast<float>(g.K * g.K);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.N * g.C, grain_for(hw)), [&](const auto& r) {
    for (int64_t p = r.begin(); p < r.end(); ++p) {
      float* dxp = dx + p * hw;  // [H, W]
      std::fill(dxp, dxp + hw, 0.f);
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          const float d = dy[(p * OH + oh) * OW + ow] * scale;
          float* win = dxp + oh * g.stride * g.W + ow * g.stride;
          for (int64_t kh = 0; kh < g.K; ++kh)
            for (int64_t kw = 0; kw < g.K; ++kw) win[kh * g.W + kw] += d;
        }
      }
    }
  });
}

}  // namespace redco::cpu
