// Weight-only int8 (quantize_rows) as an Encoding: its scales travel with
// views, slices and copies; conversions dequantize.
#include "redco/ops/cpu/quantized_rows.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/prefill_panels.hpp"

namespace redco {
namespace {

// The values of q (i8 [rows, ...]) times their row's scale, into out [numel] f32.
void dequantize(const Tensor& q, const Tensor& scales, float* out) {
  const int64_t rows = q.dim(0), cols = q.numel() / std::max<int64_t>(rows, 1);
  const auto* src = static_cast<const int8_t*>(q.raw());
  const float* scale = scales.data<float>();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, 64), [&](const auto& r) {
    for (int64_t n = r.begin(); n < r.end(); ++n)
      for (int64_t k = 0; k < cols; ++k) out[n * cols + k] = float(src[n * cols + k]) * scale[n];
  });
}

struct RowScales final : Encoding {
  Tensor scales;  // f32 [rows]
  explicit RowScales(Tensor s) : scales(std::move(s)) {}

  std::string describe() const override { return "an int8 weight quantized by rows"; }
  std::string maker() const override { return "quantize_rows"; }
  bool row_major() const override { return true; }
  void decode(const Tensor& t, DType dtype, void* out) const override {
    if (dtype == DType::f32)
      return dequantize(t, scales.to(Device::cpu()), static_cast<float*>(out));
    Tensor wide = Tensor::empty(t.shape());
    dequantize(t, scales.to(Device::cpu()), wide.data<float>());
    Tensor::borrow(out, t.shape(), dtype, nullptr).copy_from(wide);
  }
  // The scales belong to rows: a view must keep dim 0 whole.
  std::shared_ptr<const Encoding> view(const Tensor& t, const Shape& shape) const override {
    REDCO_CHECK(shape.rank() >= 1 && shape[0] == t.dim(0),
                "cannot view the int8 weight {} as {}: its scales are per row of dim 0; "
                "convert it first (.to(DType::f32))",
                t.shape(), shape);
    return std::make_shared<RowScales>(scales);
  }
  std::shared_ptr<const Encoding> rows(const Tensor&, int64_t begin, int64_t end) const override {
    return std::make_shared<RowScales>(scales.slice0(begin, end));
  }
  std::shared_ptr<const Encoding> copy_to(const Tensor&, Device d) const override {
    return std::make_shared<RowScales>(scales.to(d).clone());
  }
  // Not called for a row-major format (Tensor::clone copies the bytes and
  // calls copy_to); given for completeness, by that same path.
  Tensor clone(const Tensor& t) const override { return t.clone(); }
};

}  // namespace

Tensor quantize_rows(const Tensor& w_in) {
  // The prefill kernel is chosen (and a bad REDCO_PREFILL refused) as the
  // weights load, not at the first long prompt.
  (void)cpu::prefill_unit();
  REDCO_CHECK(w_in.defined() && is_floating(w_in.dtype()) && w_in.rank() >= 2 && w_in.on_host() &&
                  !w_in.encoding(),
              "quantize_rows: needs a floating CPU tensor of rank >= 2, got {}{}",
              w_in.defined() ? dtype_name(w_in.dtype()) : "undefined",
              w_in.defined() ? w_in.shape() : Shape{});
  const Tensor w = w_in.to(DType::f32);
  const int64_t rows = w.dim(0), cols = w.numel() / std::max<int64_t>(rows, 1);
  Tensor q = Tensor::empty(w.shape(), DType::i8), scales = Tensor::empty({rows});
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
  q.set_name(w_in.name());
  return Tensor::encoded(q, q.shape(), std::make_shared<RowScales>(scales));
}

Tensor quantized_rows(const Tensor& q, const Tensor& scales) {
  REDCO_CHECK(q.dtype() == DType::i8 && q.rank() >= 1 && scales.dtype() == DType::f32 &&
                  scales.shape() == Shape{q.dim(0)} && scales.device() == q.device(),
              "quantized_rows: needs i8 rows [n, ...] and f32 scales [n] on one device, got {}{} "
              "and {}{}",
              dtype_name(q.dtype()), q.shape(), dtype_name(scales.dtype()), scales.shape());
  return Tensor::encoded(q.detach(), q.shape(), std::make_shared<RowScales>(scales));
}

const Tensor* row_scales(const Tensor& t) {
  const auto* r = t.defined() ? dynamic_cast<const RowScales*>(t.encoding()) : nullptr;
  return r ? &r->scales : nullptr;
}

}  // namespace redco
