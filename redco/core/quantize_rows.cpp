// Weight-only int8 (Tensor::quantize_rows) and its way back (dequantize_rows,
// which Tensor::copy_from applies to any conversion of such a tensor).
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "redco/core/error.hpp"
#include "redco/core/tensor.hpp"

namespace redco {

Tensor Tensor::quantize_rows(const Tensor& w_in) {
  REDCO_CHECK(w_in.defined() && is_floating(w_in.dtype()) && w_in.rank() >= 2 && w_in.on_host() &&
                  !w_in.row_scales(),
              "quantize_rows: needs a floating CPU tensor of rank >= 2, got {}{}",
              dtype_name(w_in.dtype()), w_in.shape());
  const Tensor w = w_in.to(DType::f32);
  const int64_t rows = w.dim(0), cols = w.numel() / std::max<int64_t>(rows, 1);
  Tensor q = empty(w.shape(), DType::i8), scales = empty({rows});
  const float* src = w.data<float>();
  auto* dst = static_cast<int8_t*>(q.raw());
  float* scale = scales.data<float>();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, 64), [&](const auto& r) {
    for (int64_t n = r.begin(); n < r.end(); ++n) {
      const float* row = src + n * cols;
      float amax = 0.f;
      for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::abs(row[k]));
      REDCO_CHECK(std::isfinite(amax), "quantize_rows: row {} of {} holds a non-finite value", n,
                  w.shape());
      const float s = amax > 0.f ? amax / 127.f : 1.f;
      scale[n] = s;
      for (int64_t k = 0; k < cols; ++k)
        dst[n * cols + k] = int8_t(std::clamp(std::nearbyint(row[k] / s), -127.f, 127.f));
    }
  });
  q.impl().row_scales = std::make_shared<const Tensor>(scales);
  q.set_name(w_in.name());
  return q;
}

Tensor Tensor::quantized_rows(const Tensor& q, const Tensor& scales) {
  REDCO_CHECK(q.dtype() == DType::i8 && q.rank() >= 1 && scales.dtype() == DType::f32 &&
                  scales.shape() == Shape{q.dim(0)} && scales.device() == q.device(),
              "quantized_rows: needs i8 rows [n, ...] and f32 scales [n] on one device, got {}{} "
              "and {}{}",
              dtype_name(q.dtype()), q.shape(), dtype_name(scales.dtype()), scales.shape());
  Tensor out = q.detach();
  out.impl().row_scales = std::make_shared<const Tensor>(scales);
  return out;
}

namespace detail {
// out = q's rows times their scales, into a CPU f32 buffer [numel].
void dequantize_rows(const Tensor& q, float* out) {
  const Tensor& scales = *q.row_scales();
  const int64_t rows = q.dim(0), cols = q.numel() / std::max<int64_t>(rows, 1);
  const auto* src = static_cast<const int8_t*>(q.raw());
  const float* scale = scales.data<float>();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, 64), [&](const auto& r) {
    for (int64_t n = r.begin(); n < r.end(); ++n)
      for (int64_t k = 0; k < cols; ++k) out[n * cols + k] = float(src[n * cols + k]) * scale[n];
  });
}
}  // namespace detail

}  // namespace redco
