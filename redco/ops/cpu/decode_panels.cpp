// bf16 and int8 weights packed for decoding (pack_panels, pack_panels_i8) as
// Encodings, and their way back (unpack, which Tensor::copy_from applies to
// any conversion of one).
#include "redco/ops/cpu/decode_panels.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/panel_layout.hpp"
#include "redco/ops/cpu/prefill_panels.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"

namespace redco {
namespace {

// The storage of a packed [N, K]: [padded_rows(N), K] bf16 in panel order.
const uint16_t* packed(const Tensor& w) {
  const TensorImpl& i = w.impl();
  return reinterpret_cast<const uint16_t*>(static_cast<const char*>(i.storage->data) + i.offset);
}

// The values of a packed [N, K], row-major, into a CPU buffer [N * K] of
// bf16 (uint16_t) or f32 (float). A panel is read once, straight; its 32
// rows are written as 32 streams.
template <typename Out>
void unpack(const Tensor& w, Out* out) {
  const uint16_t* src = packed(w);
  const int64_t N = w.dim(0), K = w.dim(1), panels_n = panels::padded_rows(N) / panels::kRows;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, panels_n, 1), [&](const auto& r) {
    for (int64_t p = r.begin(); p < r.end(); ++p) {
      const int64_t n0 = p * panels::kRows, rows = std::min(panels::kRows, N - n0);
      for (int64_t k = 0; k < K; ++k) {
        const uint16_t* column = src + (p * K + k) * panels::kRows;
        for (int64_t i = 0; i < rows; ++i) {
          const uint16_t v = column[panels::slot(i)];
          if constexpr (sizeof(Out) == 2)
            out[(n0 + i) * K + k] = v;
          else
            out[(n0 + i) * K + k] = bf16_to_float(v);
        }
      }
    }
  });
}

// What a format packed in decode panels allows: the matrix itself, on the
// CPU. Any other view or a slice would read the panels as rows; `values` is
// the dtype a message tells the user to convert to first.
struct PackedFormat : Encoding {
  bool row_major() const override { return false; }
  std::shared_ptr<const Encoding> view(const Tensor& t, const Shape& shape) const override {
    REDCO_CHECK(shape == t.shape(), "cannot view {} {} as {}; convert it first (.to(DType::{}))",
                describe(), t.shape(), shape, values());
    return same();
  }
  std::shared_ptr<const Encoding> rows(const Tensor& t, int64_t, int64_t) const override {
    fail("cannot slice {} {}; convert it first (.to(DType::{})) or pack the slice", describe(),
         t.shape(), values());
  }
  std::shared_ptr<const Encoding> copy_to(const Tensor&, Device d) const override {
    REDCO_CHECK(d.is_cpu(), "{} is a CPU format; move its values with .to(DType::{}).to({})",
                describe(), values(), d.str());
    return same();
  }

 protected:
  virtual std::shared_ptr<const Encoding> same() const = 0;  // this format, for one more tensor
  virtual const char* values() const = 0;
};

struct DecodePanels final : PackedFormat {
  std::string describe() const override { return "a bf16 weight packed in decode panels"; }
  std::string maker() const override { return "pack_panels"; }
  void decode(const Tensor& t, DType dtype, void* out) const override {
    if (dtype == DType::bf16) return unpack(t, static_cast<uint16_t*>(out));
    REDCO_CHECK(dtype == DType::f32, "decode panels: decodes to f32 or bf16, not {}",
                dtype_name(dtype));
    unpack(t, static_cast<float*>(out));
  }
  Tensor clone(const Tensor& t) const override { return pack_panels(t.to(DType::bf16)); }
  // The format holds no state: one instance serves every packed tensor.
  static std::shared_ptr<const Encoding> shared() {
    static const auto one = std::make_shared<const DecodePanels>();
    return one;
  }

 protected:
  std::shared_ptr<const Encoding> same() const override { return shared(); }
  const char* values() const override { return "bf16"; }
};

// The storage of an int8 packed [N, K]: [i8::padded_rows(N), K] int8 in panel order.
const int8_t* packed_i8(const Tensor& w) {
  const TensorImpl& i = w.impl();
  return reinterpret_cast<const int8_t*>(static_cast<const char*>(i.storage->data) + i.offset);
}

// The scaled values of an int8 packed [N, K], row-major, into out [N * K] f32.
void unpack_i8(const Tensor& w, const float* scale, float* out) {
  const int8_t* src = packed_i8(w);
  const int64_t N = w.dim(0), K = w.dim(1), kRows = panels::i8::kRows;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, panels::i8::padded_rows(N) / kRows, 1),
                    [&](const auto& r) {
                      for (int64_t p = r.begin(); p < r.end(); ++p)
                        for (int64_t n = p * kRows; n < std::min(N, (p + 1) * kRows); ++n)
                          for (int64_t k = 0; k < K; ++k)
                            out[n * K + k] = float(src[panels::i8::index(n, k, K)]) * scale[n];
                    });
}

struct I8Panels final : PackedFormat {
  Tensor scales;  // f32 [N]
  explicit I8Panels(Tensor s) : scales(std::move(s)) {}

  std::string describe() const override { return "an int8 weight packed in decode panels"; }
  std::string maker() const override { return "pack_panels_i8"; }
  void decode(const Tensor& t, DType dtype, void* out) const override {
    if (dtype == DType::f32) return unpack_i8(t, scales.data<float>(), static_cast<float*>(out));
    Tensor wide = Tensor::empty(t.shape());
    unpack_i8(t, scales.data<float>(), wide.data<float>());
    Tensor::borrow(out, t.shape(), dtype, nullptr).copy_from(wide);
  }
  // The bytes and scales as they are (re-quantizing the scaled values could move a rounding).
  Tensor clone(const Tensor& t) const override {
    const TensorImpl& i = t.impl();
    const int64_t bytes = panels::i8::padded_rows(t.dim(0)) * t.dim(1);
    Tensor out = Tensor::empty(Shape{panels::i8::padded_rows(t.dim(0)), t.dim(1)}, DType::i8);
    std::memcpy(out.raw(), static_cast<const char*>(i.storage->data) + i.offset, size_t(bytes));
    out.set_name(t.name());
    return Tensor::encoded(out, t.shape(), std::make_shared<I8Panels>(scales.clone()));
  }

 protected:
  std::shared_ptr<const Encoding> same() const override {
    return std::make_shared<I8Panels>(scales);
  }
  const char* values() const override { return "f32"; }
};

const I8Panels* i8_panels_of(const Tensor& t) {
  return t.defined() ? dynamic_cast<const I8Panels*>(t.encoding()) : nullptr;
}

}  // namespace

Tensor pack_panels(const Tensor& w_in) {
  // The prefill kernel is chosen (and a bad REDCO_PREFILL refused) as the
  // weights load, not at the first long prompt.
  (void)cpu::prefill_unit();
  REDCO_CHECK(w_in.defined() && is_floating(w_in.dtype()) && w_in.rank() == 2 && w_in.on_host() &&
                  !w_in.encoding() && !w_in.placement(),
              "pack_panels: needs a floating CPU matrix [N, K] (whole on this rank), got {}{}",
              w_in.defined() ? dtype_name(w_in.dtype()) : "undefined",
              w_in.defined() ? w_in.shape() : Shape{});
  const Tensor w = w_in.to(DType::bf16);
  const int64_t N = w.dim(0), K = w.dim(1), panels_n = panels::padded_rows(N) / panels::kRows;
  // [padded_rows(N), K] bf16 of storage, seen as the logical [N, K].
  Tensor out = Tensor::empty(Shape{panels::padded_rows(N), K}, DType::bf16);
  const auto* src = static_cast<const uint16_t*>(w.raw());  // [N, K]
  auto* dst = static_cast<uint16_t*>(out.raw());            // panels
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, panels_n, 1), [&](const auto& r) {
    for (int64_t p = r.begin(); p < r.end(); ++p) {
      uint16_t* panel = dst + p * K * panels::kRows;
      std::memset(panel, 0, size_t(K * panels::kRows) * 2);  // the padding rows: zeros
      for (int64_t n = p * panels::kRows; n < std::min(N, (p + 1) * panels::kRows); ++n)
        for (int64_t k = 0; k < K; ++k) dst[panels::index(n, k, K)] = src[n * K + k];
    }
  });
  out.set_name(w_in.name());
  return Tensor::encoded(out, w.shape(), DecodePanels::shared());
}

bool in_panels(const Tensor& t) {
  return t.defined() && dynamic_cast<const DecodePanels*>(t.encoding()) != nullptr;
}

const uint16_t* panel_data(const Tensor& t) {
  REDCO_CHECK(t.defined(), "panel_data: the tensor is undefined");
  REDCO_CHECK(in_panels(t), "panel_data: tensor {}{} is not packed in decode panels",
              dtype_name(t.dtype()), t.shape());
  return packed(t);
}

Tensor pack_panels_i8(const Tensor& w) {
  REDCO_CHECK(w.defined() && is_floating(w.dtype()) && w.rank() == 2 && w.on_host() &&
                  !w.encoding() && !w.placement(),
              "pack_panels_i8: needs a floating CPU matrix [N, K] (whole on this rank), got {}{}",
              w.defined() ? dtype_name(w.dtype()) : "undefined", w.defined() ? w.shape() : Shape{});
  const Tensor rows = quantize_rows(w);  // the int8 values and scales, row-major
  const int64_t N = w.dim(0), K = w.dim(1), kRows = panels::i8::kRows;
  Tensor out = Tensor::empty(Shape{panels::i8::padded_rows(N), K}, DType::i8);
  const auto* src = static_cast<const int8_t*>(rows.raw());  // [N, K]
  auto* dst = static_cast<int8_t*>(out.raw());
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, panels::i8::padded_rows(N) / kRows, 1),
                    [&](const auto& r) {
                      for (int64_t p = r.begin(); p < r.end(); ++p) {
                        std::memset(dst + p * K * kRows, 0, size_t(K * kRows));  // padding rows
                        for (int64_t n = p * kRows; n < std::min(N, (p + 1) * kRows); ++n)
                          for (int64_t k = 0; k < K; ++k)
                            dst[panels::i8::index(n, k, K)] = src[n * K + k];
                      }
                    });
  out.set_name(w.name());
  return Tensor::encoded(out, w.shape(), std::make_shared<I8Panels>(*row_scales(rows)));
}

bool in_i8_panels(const Tensor& t) { return i8_panels_of(t) != nullptr; }

const int8_t* i8_panel_data(const Tensor& t) {
  REDCO_CHECK(in_i8_panels(t), "i8_panel_data: tensor {}{} is not packed in int8 decode panels",
              t.defined() ? dtype_name(t.dtype()) : "undefined", t.defined() ? t.shape() : Shape{});
  return packed_i8(t);
}

const float* i8_panel_scales(const Tensor& t) {
  REDCO_CHECK(in_i8_panels(t), "i8_panel_scales: tensor {}{} is not packed in int8 decode panels",
              t.defined() ? dtype_name(t.dtype()) : "undefined", t.defined() ? t.shape() : Shape{});
  return i8_panels_of(t)->scales.data<float>();
}

}  // namespace redco
