// bf16 weights packed in decode panels (pack_panels,
// redco/ops/cpu/panel_layout.hpp) and the decode kernel that reads them
// (redco/ops/cpu/skinny_panels.hpp): the layout as documented, the values back
// row-major through every conversion, each output the one FMA chain over k
// the header promises (exactly, on whichever CPU runs it, so a row's result
// does not depend on the batch), the general path for more rows, and every
// read that would misread the order refused.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/core/tensor.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "redco/ops/cpu/panel_layout.hpp"
#include "redco/ops/cpu/prefill_panels.hpp"
#include "redco/ops/cpu/skinny_bf16.hpp"
#include "redco/ops/cpu/skinny_panels.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"

namespace redco {
namespace {

Tensor values(Shape s, uint64_t seed) { return Tensor::uniform(s, seed, 0, -1.f, 1.f); }

std::vector<uint16_t> bf16_bits(const Tensor& t) {  // a row-major bf16 tensor's values
  const auto* p = static_cast<const uint16_t*>(t.raw());
  return std::vector<uint16_t>(p, p + t.numel());
}

// y[m, n] as the kernel promises: fma over k in order from zero.
float chain(const float* x, const uint16_t* w, int64_t K) {
  float acc = 0.f;
  for (int64_t k = 0; k < K; ++k) acc = std::fma(bf16_to_float(w[k]), x[k], acc);
  return acc;
}

}  // namespace

TEST_CASE("bf16 panels: the documented layout, zero padding, and the values back row-major",
          "[cpu][panels]") {
  for (int64_t N : {1, 31, 32, 33, 67})
    for (int64_t K : {1, 17, 64}) {
      INFO("N " << N << " K " << K);
      const Tensor w = values(Shape{N, K}, uint64_t(N * 100 + K));
      const Tensor w16 = w.to(DType::bf16);
      const Tensor p = pack_panels(w);
      REQUIRE(in_panels(p));
      REQUIRE(p.shape() == w.shape());
      REQUIRE(p.dtype() == DType::bf16);
      const std::vector<uint16_t> rows = bf16_bits(w16);
      const uint16_t* packed = panel_data(p);
      for (int64_t n = 0; n < panels::padded_rows(N); ++n)
        for (int64_t k = 0; k < K; ++k)
          REQUIRE(packed[panels::index(n, k, K)] == (n < N ? rows[size_t(n * K + k)] : 0));
      // Output i of a column sits at slot(i): 0-15 in the low halves, 16-31 in the high.
      CHECK(panels::slot(0) == 0);
      CHECK(panels::slot(1) == 2);
      CHECK(panels::slot(16) == 1);
      CHECK(panels::slot(31) == 31);
      CHECK(bf16_bits(p.to(DType::bf16)) == rows);
      CHECK(p.to(DType::f32).to_vector() == w16.to(DType::f32).to_vector());
      CHECK(p.to(DType::f16).to_vector() == w16.to(DType::f16).to_vector());
      const Tensor c = p.clone();
      CHECK(in_panels(c));
      CHECK(bf16_bits(c.to(DType::bf16)) == rows);
      CHECK(in_panels(p.detach()));
      CHECK(in_panels(p.view(w.shape())));
    }
}

TEST_CASE("bf16 panels: each output is one FMA chain over k, at every row count",
          "[cpu][panels][matmul]") {
  for (int64_t K : {1, 15, 16, 17, 48, 771}) {
    const int64_t N = 67;  // two whole panels and a ragged one
    const Tensor w = values(Shape{N, K}, uint64_t(K + 9)).to(DType::bf16);
    const Tensor p = pack_panels(w);
    const std::vector<uint16_t> rows = bf16_bits(w);
    for (int64_t M = 1; M <= cpu::kSkinnyRows + 3; ++M) {
      INFO("M " << M << " K " << K);
      const Tensor x = values(Shape{M, K}, uint64_t(K * 100 + M));
      const Tensor y = cpu::matmul(x, p, false, true);  // the panel kernel at every row count
      const float* yp = y.data<float>();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          REQUIRE(yp[m * N + n] == chain(x.data<float>() + m * K, rows.data() + n * K, K));
      // Any other product with it (here as the left operand) reads the unpacked values.
      CHECK(cpu::matmul(p, x, false, true).to_vector() ==
            cpu::matmul(w, x, false, true).to_vector());
    }
  }
  // The kernel itself leaves the gaps of a wider y untouched.
  const int64_t M = 3, N = 40, K = 20;
  const Tensor x = values(Shape{M, K}, 1), p = pack_panels(values(Shape{N, K}, 2));
  std::vector<float> y(size_t(M * (N + 5)), -7.f);
  cpu::skinny_matmul_panels(x.data<float>(), K, panel_data(p), y.data(), N + 5, M, N, K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = N; n < N + 5; ++n) REQUIRE(y[size_t(m * (N + 5) + n)] == -7.f);
}

TEST_CASE("bf16 panels: reads that would take the panels for rows are refused by name",
          "[cpu][panels]") {
  const Tensor p = pack_panels(values(Shape{6, 4}, 3));
  using Catch::Contains;
  CHECK_THROWS_WITH(p.raw(), Contains("decode panels"));
  CHECK_THROWS_WITH(p.device_ptr(), Contains("decode panels"));
  CHECK_THROWS_WITH(p.view({4, 6}), Contains("decode panels"));
  CHECK_THROWS_WITH(p.slice0(1, 3), Contains("decode panels"));
  Tensor into = pack_panels(values(Shape{6, 4}, 4));
  CHECK_THROWS_WITH(into.copy_from(Tensor::zeros({6, 4})), Contains("pack_panels"));
  CHECK_THROWS_WITH(pack_panels(values(Shape{2, 3, 4}, 5)), Contains("[N, K]"));
  CHECK_THROWS_WITH(pack_panels(p), Contains("[N, K]"));
  CHECK_THROWS_WITH(panel_data(Tensor()), Contains("undefined"));
  CHECK_THROWS_WITH(panel_data(values(Shape{2, 2}, 6)), Contains("not packed"));
  CHECK(p.str().find("decode panels") != std::string::npos);
}

}  // namespace redco

namespace redco {
namespace {

// sum_k bf16(x[k]) * w[k] in double, and the sum of the products' magnitudes
// (the f32 rounding a kernel may add is bounded by a few ulps of that).
std::pair<double, double> rounded_product(const float* x, const uint16_t* w, int64_t K) {
  double s = 0, mag = 0;
  for (int64_t k = 0; k < K; ++k) {
    const double p = double(bf16_to_float(float_to_bf16(x[k]))) * bf16_to_float(w[k]);
    s += p;
    mag += std::fabs(p);
  }
  return {s, mag};
}

std::vector<cpu::PrefillUnit> units_here() {
  std::vector<cpu::PrefillUnit> units;
  if (cpu::best_prefill_unit() >= cpu::PrefillUnit::dpbf16)
    units.push_back(cpu::PrefillUnit::dpbf16);
  if (cpu::best_prefill_unit() == cpu::PrefillUnit::amx) units.push_back(cpu::PrefillUnit::amx);
  return units;
}

}  // namespace

TEST_CASE("bf16 panels: prefill on bf16 units is the product of bf16-rounded rows",
          "[cpu][panels][matmul]") {
  const std::vector<cpu::PrefillUnit> units = units_here();
  if (units.empty()) {  // neither unit: every row count takes the f32 chain
    REQUIRE(cpu::prefill_unit() == cpu::PrefillUnit::none);
    const int64_t M = cpu::kPrefillRows + 5, N = 40, K = 33;
    const Tensor x = values(Shape{M, K}, 3), w = values(Shape{N, K}, 4).to(DType::bf16);
    const Tensor y = cpu::matmul(x, pack_panels(w), false, true);
    const std::vector<uint16_t> rows = bf16_bits(w);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        REQUIRE(y.data<float>()[m * N + n] ==
                chain(x.data<float>() + m * K, rows.data() + n * K, K));
    return;
  }
  for (const cpu::PrefillUnit unit : units)
    for (int64_t K : {1, 31, 32, 33, 100, 515})
      for (int64_t N : {32, 67}) {
        const Tensor w = values(Shape{N, K}, uint64_t(K * 7 + N)).to(DType::bf16);
        const Tensor p = pack_panels(w);
        const std::vector<uint16_t> rows = bf16_bits(w);
        for (int64_t M : {1, 5, 32, 33, 70}) {
          INFO("unit " << int(unit) << " M " << M << " N " << N << " K " << K);
          const Tensor x = values(Shape{M, K}, uint64_t(K * 100 + M));
          const int64_t ldy = N + 3;  // a wider y: its gaps stay untouched
          std::vector<float> y(size_t(M * ldy), -7.f), alone(size_t(ldy), -7.f);
          cpu::prefill_matmul_panels(x.data<float>(), K, panel_data(p), y.data(), ldy, M, N, K,
                                     unit);
          for (int64_t m = 0; m < M; ++m) {
            // A row gets the same bits alone as inside the batch.
            cpu::prefill_matmul_panels(x.data<float>() + m * K, K, panel_data(p), alone.data(), ldy,
                                       1, N, K, unit);
            for (int64_t n = 0; n < N; ++n) {
              const auto [ref, mag] =
                  rounded_product(x.data<float>() + m * K, rows.data() + n * K, K);
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
}

}  // namespace redco
