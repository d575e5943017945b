// bf16 weights packed for decoding (Tensor::pack_panels) and their way back
// (unpack_panels, which Tensor::copy_from applies to any conversion of one).
#include "redco/core/bf16_panels.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>

#include "redco/core/error.hpp"
#include "redco/core/tensor.hpp"

namespace redco {

Tensor Tensor::pack_panels(const Tensor& w_in) {
  REDCO_CHECK(w_in.defined() && is_floating(w_in.dtype()) && w_in.rank() == 2 && w_in.on_host() &&
                  !w_in.panels() && !w_in.placement(),
              "pack_panels: needs a floating CPU matrix [N, K] (whole on this rank), got {}{}",
              w_in.defined() ? dtype_name(w_in.dtype()) : "undefined",
              w_in.defined() ? w_in.shape() : Shape{});
  const Tensor w = w_in.to(DType::bf16);
  const int64_t N = w.dim(0), K = w.dim(1), panels_n = panels::padded_rows(N) / panels::kRows;
  // [padded_rows(N), K] bf16 of storage, seen as the logical [N, K].
  Tensor out = empty(Shape{panels::padded_rows(N), K}, DType::bf16);
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
  out.impl().shape = w.shape();
  out.impl().panels = true;
  out.set_name(w_in.name());
  return out;
}

const uint16_t* Tensor::panel_data() const {
  REDCO_CHECK(panels(), "panel_data: tensor {}{} is not packed in decode panels",
              dtype_name(dtype()), shape());
  const TensorImpl& i = impl();
  return reinterpret_cast<const uint16_t*>(static_cast<const char*>(i.storage->data) + i.offset);
}

namespace detail {
// The values of a pack_panels tensor [N, K], row-major, into a CPU buffer
// [N * K] of bf16 (uint16_t) or f32 (float). A panel is read once, straight;
// its 32 rows are written as 32 streams.
template <typename Out>
void unpack_panels_to(const Tensor& w, Out* out) {
  const uint16_t* src = w.panel_data();
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
void unpack_panels(const Tensor& w, uint16_t* out) { unpack_panels_to(w, out); }
void unpack_panels(const Tensor& w, float* out) { unpack_panels_to(w, out); }
}  // namespace detail

}  // namespace redco
