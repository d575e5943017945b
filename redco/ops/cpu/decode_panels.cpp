// bf16 weights packed for decoding (pack_panels) as an Encoding, and their
// way back (unpack, which Tensor::copy_from applies to any conversion of one).
#include "redco/ops/cpu/decode_panels.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/panel_layout.hpp"
#include "redco/ops/cpu/prefill_panels.hpp"

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

struct DecodePanels final : Encoding {
  std::string describe() const override { return "a bf16 weight packed in decode panels"; }
  std::string maker() const override { return "pack_panels"; }
  bool row_major() const override { return false; }
  void decode(const Tensor& t, DType dtype, void* out) const override {
    if (dtype == DType::bf16) return unpack(t, static_cast<uint16_t*>(out));
    REDCO_CHECK(dtype == DType::f32, "decode panels: decodes to f32 or bf16, not {}",
                dtype_name(dtype));
    unpack(t, static_cast<float*>(out));
  }
  // Only the matrix itself: any other view would read the panels as rows.
  std::shared_ptr<const Encoding> view(const Tensor& t, const Shape& shape) const override {
    REDCO_CHECK(shape == t.shape(),
                "cannot view the bf16 weight {} packed in decode panels as {}; convert it first "
                "(.to(DType::bf16))",
                t.shape(), shape);
    return shared();
  }
  std::shared_ptr<const Encoding> rows(const Tensor& t, int64_t, int64_t) const override {
    fail(
        "cannot slice the bf16 weight {} packed in decode panels; convert it first "
        "(.to(DType::bf16)) or pack the slice",
        t.shape());
  }
  std::shared_ptr<const Encoding> copy_to(const Tensor&, Device d) const override {
    REDCO_CHECK(d.is_cpu(),
                "a bf16 weight packed in decode panels is a CPU format; move its values with "
                ".to(DType::bf16).to({})",
                d.str());
    return shared();
  }
  Tensor clone(const Tensor& t) const override { return pack_panels(t.to(DType::bf16)); }
  // The format holds no state: one instance serves every packed tensor.
  static std::shared_ptr<const Encoding> shared() {
    static const auto one = std::make_shared<const DecodePanels>();
    return one;
  }
};

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

}  // namespace redco
