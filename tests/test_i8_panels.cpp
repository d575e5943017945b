// Int8 weights packed in decode panels (pack_panels_i8,
// redco/ops/cpu/panel_layout.hpp) and the kernels that read them: the layout
// as documented with quantize_rows' values and scales, the scaled values back
// row-major, each decoded output the one FMA chain over k times its scale the
// header promises (exactly, at every row count, so a row's bits do not depend
// on the batch), prefills on bf16 units as the product of bf16-rounded rows,
// embedding rows gathered, and every read that would misread the order refused.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/core/tensor.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "redco/ops/cpu/embedding.hpp"
#include "redco/ops/cpu/panel_layout.hpp"
#include "redco/ops/cpu/prefill_panels.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"
#include "redco/ops/cpu/skinny_bf16.hpp"
#include "redco/ops/cpu/skinny_i8_panels.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"

namespace redco {
namespace {

Tensor values(Shape s, uint64_t seed) { return Tensor::uniform(s, seed, 0, -1.f, 1.f); }

struct Rows {  // quantize_rows' int8 values and scales of w, row-major
  std::vector<int8_t> q;
  std::vector<float> scale;
};
Rows rows_of(const Tensor& w) {
  const Tensor r = quantize_rows(w);
  const auto* p = static_cast<const int8_t*>(r.raw());
  const float* s = row_scales(r)->data<float>();
  return {std::vector<int8_t>(p, p + r.numel()), std::vector<float>(s, s + r.dim(0))};
}

// y[m, n] as the decode kernel promises: fma over k in order from zero, times the scale.
float chain(const float* x, const int8_t* q, int64_t K, float scale) {
  float acc = 0.f;
  for (int64_t k = 0; k < K; ++k) acc = std::fma(float(q[k]), x[k], acc);
  return acc * scale;
}

}  // namespace

TEST_CASE("int8 panels: the documented layout, quantize_rows' values and the values back",
          "[cpu][panels][int8]") {
  for (int64_t N : {1, 63, 64, 65, 130})
    for (int64_t K : {1, 17, 64}) {
      INFO("N " << N << " K " << K);
      const Tensor w = values(Shape{N, K}, uint64_t(N * 100 + K));
      const Rows want = rows_of(w);
      const Tensor p = pack_panels_i8(w);
      REQUIRE(in_i8_panels(p));
      REQUIRE(!in_panels(p));
      REQUIRE(row_scales(p) == nullptr);  // not row-major: the row kernels must not take it
      REQUIRE(p.shape() == w.shape());
      REQUIRE(p.dtype() == DType::i8);
      const int8_t* packed = i8_panel_data(p);
      for (int64_t n = 0; n < panels::i8::padded_rows(N); ++n)
        for (int64_t k = 0; k < K; ++k)
          REQUIRE(packed[panels::i8::index(n, k, K)] == (n < N ? want.q[size_t(n * K + k)] : 0));
      CHECK(panels::i8::index(1, 0, K) == 1);        // outputs side by side in a column
      CHECK(panels::i8::index(0, 1, K) == 64);       // a column a cache line
      CHECK(panels::i8::index(64, 0, K) == 64 * K);  // the next panel after K columns
      CHECK(std::vector<float>(i8_panel_scales(p), i8_panel_scales(p) + N) == want.scale);
      const std::vector<float> scaled = quantize_rows(w).to(DType::f32).to_vector();
      CHECK(p.to(DType::f32).to_vector() == scaled);
      CHECK(p.to(DType::bf16).to(DType::f32).to_vector() ==
            quantize_rows(w).to(DType::bf16).to(DType::f32).to_vector());
      const Tensor c = p.clone();
      CHECK(in_i8_panels(c));
      CHECK(c.to(DType::f32).to_vector() == scaled);
      CHECK(in_i8_panels(p.detach()));
      CHECK(in_i8_panels(p.view(w.shape())));
    }
}

TEST_CASE("int8 panels: each output is one FMA chain over k times its scale, at every row count",
          "[cpu][panels][int8][matmul]") {
  for (int64_t K : {1, 15, 16, 17, 48, 771}) {
    const int64_t N = 3 * 64 + 5;  // a pair of panels, a whole one and a ragged one
    const Tensor w = values(Shape{N, K}, uint64_t(K + 9));
    const Tensor p = pack_panels_i8(w);
    const Rows r = rows_of(w);
    for (int64_t M = 1; M <= cpu::kSkinnyRows + 3; ++M) {
      INFO("M " << M << " K " << K);
      const Tensor x = values(Shape{M, K}, uint64_t(K * 100 + M));
      const Tensor y = cpu::matmul(x, p, false, true);  // the panel kernel below 32 rows
      const float* yp = y.data<float>();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          REQUIRE(yp[m * N + n] ==
                  chain(x.data<float>() + m * K, r.q.data() + n * K, K, r.scale[size_t(n)]));
    }
    // Any other product with it (here as the left operand) reads the scaled values.
    const Tensor x = values(Shape{3, K}, 5);
    CHECK(cpu::matmul(p, x, false, true).to_vector() ==
          cpu::matmul(quantize_rows(w).to(DType::f32), x, false, true).to_vector());
  }
  // The kernel itself leaves the gaps of a wider y untouched.
  const int64_t M = 3, N = 70, K = 20;
  const Tensor x = values(Shape{M, K}, 1), p = pack_panels_i8(values(Shape{N, K}, 2));
  for (const int64_t rows : {int64_t{1}, M}) {
    std::vector<float> y(size_t(rows * (N + 5)), -7.f);
    cpu::skinny_matmul_i8_panels(x.data<float>(), K, i8_panel_data(p), i8_panel_scales(p), y.data(),
                                 N + 5, rows, N, K);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t n = N; n < N + 5; ++n) REQUIRE(y[size_t(m * (N + 5) + n)] == -7.f);
  }
}

TEST_CASE("int8 panels: prefill on bf16 units is the product of bf16-rounded rows, scaled",
          "[cpu][panels][int8][matmul]") {
  std::vector<cpu::PrefillUnit> units;
  if (cpu::best_prefill_unit() >= cpu::PrefillUnit::dpbf16)
    units.push_back(cpu::PrefillUnit::dpbf16);
  if (cpu::best_prefill_unit() == cpu::PrefillUnit::amx) units.push_back(cpu::PrefillUnit::amx);
  for (const cpu::PrefillUnit unit : units)
    for (int64_t K : {1, 31, 32, 33, 100, 515})
      for (int64_t N : {32, 64, 97, 160}) {
        const Tensor w = values(Shape{N, K}, uint64_t(K * 7 + N));
        const Tensor p = pack_panels_i8(w);
        const Rows r = rows_of(w);
        for (int64_t M : {1, 5, 32, 33, 70}) {
          INFO("unit " << int(unit) << " M " << M << " N " << N << " K " << K);
          const Tensor x = values(Shape{M, K}, uint64_t(K * 100 + M));
          const float* xp = x.data<float>();
          const int64_t ldy = N + 3;  // a wider y: its gaps stay untouched
          std::vector<float> y(size_t(M * ldy), -7.f), alone(size_t(ldy), -7.f);
          cpu::prefill_matmul_i8_panels(xp, K, i8_panel_data(p), i8_panel_scales(p), y.data(), ldy,
                                        M, N, K, unit);
          for (int64_t m = 0; m < M; ++m) {
            // A row gets the same bits alone as inside the batch.
            cpu::prefill_matmul_i8_panels(xp + m * K, K, i8_panel_data(p), i8_panel_scales(p),
                                          alone.data(), ldy, 1, N, K, unit);
            for (int64_t n = 0; n < N; ++n) {
              double ref = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double t = double(bf16_to_float(float_to_bf16(xp[m * K + k]))) *
                                 double(r.q[size_t(n * K + k)]) * r.scale[size_t(n)];
                ref += t;
                mag += std::fabs(t);
              }
              const float got = y[size_t(m * ldy + n)];
              REQUIRE(std::fabs(got - ref) <= 4e-7 * mag + 1e-30);
              REQUIRE(got == alone[size_t(n)]);
            }
            for (int64_t n = N; n < ldy; ++n) REQUIRE(y[size_t(m * ldy + n)] == -7.f);
          }
          // Through the matmul: from kPrefillRows rows, the chosen unit's bits.
          if (M >= cpu::kPrefillRows && unit == cpu::prefill_unit()) {
            const Tensor ym = cpu::matmul(x, p, false, true);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n)
                REQUIRE(ym.data<float>()[m * N + n] == y[size_t(m * ldy + n)]);
          }
        }
      }
  if (units.empty()) SUCCEED("no bf16 unit on this CPU: the chain kernel's test covers it");
}

TEST_CASE("int8 panels: embedding rows gathered and scaled; misreads refused by name",
          "[cpu][panels][int8]") {
  const int64_t V = 70, D = 9;
  const Tensor w = values(Shape{V, D}, 11);
  const Tensor p = pack_panels_i8(w);
  const std::vector<float> scaled = quantize_rows(w).to(DType::f32).to_vector();
  const std::vector<int64_t> ids{0, 69, 64, 3, 64};
  std::vector<float> out(ids.size() * size_t(D));
  cpu::embedding_forward_i8_panels(i8_panel_data(p), i8_panel_scales(p), ids.data(), out.data(),
                                   int64_t(ids.size()), V, D);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t d = 0; d < D; ++d)
      REQUIRE(out[i * size_t(D) + size_t(d)] == scaled[size_t(ids[i] * D + d)]);
  using Catch::Contains;
  CHECK_THROWS_WITH(p.raw(), Contains("decode panels"));
  CHECK_THROWS_WITH(p.view({D, V}), Contains("decode panels"));
  CHECK_THROWS_WITH(p.slice0(1, 3), Contains("decode panels"));
  Tensor into = pack_panels_i8(values(Shape{V, D}, 4));
  CHECK_THROWS_WITH(into.copy_from(Tensor::zeros({V, D})), Contains("pack_panels_i8"));
  CHECK_THROWS_WITH(pack_panels_i8(values(Shape{2, 3, 4}, 5)), Contains("[N, K]"));
  CHECK_THROWS_WITH(pack_panels_i8(p), Contains("[N, K]"));
  CHECK_THROWS_WITH(i8_panel_data(Tensor()), Contains("not packed"));
  CHECK_THROWS_WITH(i8_panel_scales(values(Shape{2, 2}, 6)), Contains("not packed"));
  CHECK(p.str().find("int8 weight packed in decode panels") != std::string::npos);
}

}  // namespace redco
