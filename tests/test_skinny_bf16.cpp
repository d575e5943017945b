// The decode GEMM against bf16 weights (redco/ops/cpu/skinny_bf16.hpp): every
// row count up to kSkinnyRows and ragged K against a double-precision
// reference on the widened weights, and cpu::matmul routing bf16 weights
// there with the result of the general path on the widened copy; the same for
// the f32 decode kernel (redco/ops/cpu/skinny_f32.hpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/core/tensor.hpp"
#include "redco/ops/cpu/prefill_i8.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"
#include "redco/ops/cpu/skinny_bf16.hpp"
#include "redco/ops/cpu/skinny_blocks.hpp"
#include "redco/ops/cpu/skinny_f32.hpp"
#include "redco/ops/cpu/skinny_i8.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"

namespace redco {
namespace {

// Uniform values in [-1, 1) from a fixed seed, through Tensor's Philox.
Tensor values(Shape s, uint64_t seed) { return Tensor::uniform(s, seed, 0, -1.f, 1.f); }

// The largest |got - want| over `want`'s scale (sum of |terms| per entry).
double max_rel_error(const float* got, const Tensor& x, const Tensor& w16, int64_t M, int64_t N,
                     int64_t K, int64_t ldy) {
  const Tensor w = w16.to(DType::f32);
  const float *xp = x.data<float>(), *wp = w.data<float>();
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0, scale = 1e-30;
      for (int64_t k = 0; k < K; ++k) {
        sum += double(xp[m * K + k]) * double(wp[n * K + k]);
        scale += std::abs(double(xp[m * K + k]) * double(wp[n * K + k]));
      }
      worst = std::max(worst, std::abs(double(got[m * ldy + n]) - sum) / scale);
    }
  return worst;
}

}  // namespace

TEST_CASE("skinny bf16 matmul equals the widened product for every row count",
          "[cpu][matmul][bf16]") {
  for (int64_t K : {1, 15, 16, 17, 48, 771}) {
    for (int64_t M = 1; M <= cpu::kSkinnyRows; ++M) {
      const int64_t N = 67;
      const Tensor x = values(Shape{M, K}, uint64_t(K * 100 + M));
      const Tensor w = values(Shape{N, K}, uint64_t(K)).to(DType::bf16);
      std::vector<float> y(size_t(M * (N + 3)), -7.f);  // ldy > N: the gaps stay untouched
      cpu::skinny_matmul_bf16(x.data<float>(), K, static_cast<const uint16_t*>(w.raw()), K,
                              y.data(), N + 3, M, N, K);
      INFO("M " << M << " K " << K);
      CHECK(max_rel_error(y.data(), x, w, M, N, K, N + 3) < 1e-6);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = N; n < N + 3; ++n) REQUIRE(y[size_t(m * (N + 3) + n)] == -7.f);
    }
  }
}

TEST_CASE("cpu matmul sends few rows against bf16 weights to the skinny kernel",
          "[cpu][matmul][bf16]") {
  const int64_t K = 200, N = 3000;  // N large enough for several tasks
  const Tensor w16 = values(Shape{N, K}, 9).to(DType::bf16);
  for (int64_t rows : {int64_t(1), int64_t(4), cpu::kSkinnyRows, cpu::kSkinnyRows + 1}) {
    const Tensor x = values(Shape{1, rows, K}, uint64_t(rows));  // leading dims fold into rows
    const Tensor y = cpu::matmul(x, w16, false, true);
    const Tensor ref = cpu::matmul(x, w16.to(DType::f32), false, true);
    REQUIRE(y.shape() == Shape{1, rows, N});
    INFO("rows " << rows);
    CHECK(max_rel_error(y.data<float>(), x.view({rows, K}), w16, rows, N, K, N) < 1e-6);
    CHECK(max_rel_error(ref.data<float>(), x.view({rows, K}), w16, rows, N, K, N) < 1e-6);
  }
}

TEST_CASE("skinny f32 matmul equals the double product for every row count", "[cpu][matmul]") {
  for (int64_t K : {1, 15, 16, 17, 48, 771}) {
    for (int64_t M = 1; M <= cpu::kSkinnyRows; ++M) {
      const int64_t N = 67;
      const Tensor x = values(Shape{M, K}, uint64_t(K * 100 + M));
      // f32 weights that are exactly bf16 values, so the bf16 reference above applies.
      const Tensor w16 = values(Shape{N, K}, uint64_t(K)).to(DType::bf16);
      const Tensor w = w16.to(DType::f32);
      std::vector<float> y(size_t(M * (N + 3)), -7.f);  // ldy > N: the gaps stay untouched
      cpu::skinny_matmul_f32(x.data<float>(), K, w.data<float>(), K, y.data(), N + 3, M, N, K);
      INFO("M " << M << " K " << K);
      CHECK(max_rel_error(y.data(), x, w16, M, N, K, N + 3) < 1e-6);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = N; n < N + 3; ++n) REQUIRE(y[size_t(m * (N + 3) + n)] == -7.f);
    }
  }
}

TEST_CASE("cpu matmul sends few rows against f32 weights to the skinny kernel", "[cpu][matmul]") {
  const int64_t K = 200, N = 3000;
  const Tensor w16 = values(Shape{N, K}, 10).to(DType::bf16);
  const Tensor w = w16.to(DType::f32);
  for (int64_t rows : {int64_t(1), int64_t(3), cpu::kSkinnyRows, cpu::kSkinnyRows + 1}) {
    const Tensor x = values(Shape{1, rows, K}, uint64_t(rows + 50));
    const Tensor y = cpu::matmul(x, w, false, true);
    REQUIRE(y.shape() == Shape{1, rows, N});
    INFO("rows " << rows);
    CHECK(max_rel_error(y.data<float>(), x.view({rows, K}), w16, rows, N, K, N) < 1e-6);
  }
  // Rows that a gradient will flow back through keep the general GEMM: the same values.
  Tensor x = values(Shape{2, K}, 77);
  const Tensor inference = cpu::matmul(x, w, false, true);
  x.set_requires_grad();
  const Tensor training = cpu::matmul(x, w, false, true);
  CHECK(max_rel_error(training.data<float>(), x, w16, 2, N, K, N) < 1e-6);
  CHECK(max_rel_error(inference.data<float>(), x, w16, 2, N, K, N) < 1e-6);
}

// Batch invariance: each output is summed in one order whatever the row and
// weight blocks around it (skinny_blocks.hpp), so a row's products equal the
// ones it gets decoded alone, bit for bit (sampling then draws the same
// tokens whatever the batch a prompt sits in).
TEST_CASE("skinny matmuls give a row the same bits in every batch", "[cpu][matmul]") {
  const int64_t N = 37, K = 100;  // N not a multiple of any weight block, K with a tail
  const Tensor x = values(Shape{cpu::kSkinnyRows, K}, 11);
  const Tensor w = values(Shape{N, K}, 12), w16 = w.to(DType::bf16);
  const auto* w16p = static_cast<const uint16_t*>(w16.raw());
  std::vector<float> alone32(size_t(cpu::kSkinnyRows * N)), alone16(alone32.size());
  for (int64_t m = 0; m < cpu::kSkinnyRows; ++m) {
    const float* xm = x.data<float>() + m * K;
    cpu::skinny_matmul_f32(xm, K, w.data<float>(), K, alone32.data() + m * N, N, 1, N, K);
    cpu::skinny_matmul_bf16(xm, K, w16p, K, alone16.data() + m * N, N, 1, N, K);
  }
  for (int64_t M = 2; M <= cpu::kSkinnyRows; ++M) {
    std::vector<float> y32(size_t(M * N)), y16(size_t(M * N));
    cpu::skinny_matmul_f32(x.data<float>(), K, w.data<float>(), K, y32.data(), N, M, N, K);
    cpu::skinny_matmul_bf16(x.data<float>(), K, w16p, K, y16.data(), N, M, N, K);
    INFO("M " << M);
    for (size_t i = 0; i < y32.size(); ++i) {
      REQUIRE(y32[i] == alone32[i]);
      REQUIRE(y16[i] == alone16[i]);
    }
  }
}

#if REDCO_SKINNY_AVX2
namespace {
// One output as the AVX2 kernels sum it: two 8-lane FMA chains over each 16
// weights (f32 and int8: the first and second 8; bf16: even and odd
// elements), added lane by lane, then the lanes (4 + 4, 2 + 2, 1 + 1), then
// the tail past the last whole 16 in order, as FMAs.
float avx2_order(const float* x, const float* w, int64_t K, bool even_odd) {
  float acc[2][8] = {};
  const int64_t K16 = K / 16 * 16;
  for (int64_t k = 0; k < K16; k += 16)
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 8; ++j) {
        const int64_t e = k + (even_odd ? 2 * j + h : 8 * h + j);
        acc[h][j] = std::fma(w[e], x[e], acc[h][j]);
      }
  float v[8], q[4];
  for (int j = 0; j < 8; ++j) v[j] = acc[0][j] + acc[1][j];
  for (int j = 0; j < 4; ++j) q[j] = v[j] + v[j + 4];
  float s = (q[0] + q[2]) + (q[1] + q[3]);
  for (int64_t t = K16; t < K; ++t) s = std::fma(x[t], w[t], s);
  return s;
}
}  // namespace

// The AVX-512 kernels (16-lane FMAs, 8 rows a pass) hold the AVX2 kernels'
// two accumulators side by side, so on either CPU every output has the bits
// of the AVX2 summation order: decoding gives the same tokens on both.
TEST_CASE("skinny matmuls sum in the AVX2 kernels' order on every x86 CPU", "[cpu][matmul]") {
  const int64_t N = 21;
  for (const int64_t K : {16, 100, 771, 1100})  // 1100: K chunks (more than 4 rows)
    for (const int64_t M : {1, 4, 5, 8}) {
      const Tensor x = values(Shape{M, K}, uint64_t(K + M)), w = values(Shape{N, K}, uint64_t(K));
      const Tensor w16 = w.to(DType::bf16), w16f = w16.to(DType::f32);
      std::vector<float> y32(size_t(M * N)), y16(y32.size()), y8(y32.size());
      cpu::skinny_matmul_f32(x.data<float>(), K, w.data<float>(), K, y32.data(), N, M, N, K);
      cpu::skinny_matmul_bf16(x.data<float>(), K, static_cast<const uint16_t*>(w16.raw()), K,
                              y16.data(), N, M, N, K);
      const Tensor q8 = quantize_rows(w);
      cpu::skinny_matmul_i8(x.data<float>(), K, static_cast<const int8_t*>(q8.raw()), K,
                            row_scales(q8)->data<float>(), y8.data(), N, M, N, K);
      // The int8 kernel sums the integer weights and scales the sum.
      Tensor unscaled = Tensor::empty(Shape{N, K});
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          unscaled.data<float>()[n * K + k] =
              float(static_cast<const int8_t*>(q8.raw())[n * K + k]);
      INFO("M " << M << " K " << K);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          const float* xm = x.data<float>() + m * K;
          const size_t i = size_t(m * N + n);
          REQUIRE(y32[i] == avx2_order(xm, w.data<float>() + n * K, K, false));
          REQUIRE(y16[i] == avx2_order(xm, w16f.data<float>() + n * K, K, true));
          REQUIRE(y8[i] == avx2_order(xm, unscaled.data<float>() + n * K, K, false) *
                               row_scales(q8)->data<float>()[n]);
        }
    }
}
#endif

// Weight-only int8 (quantize_rows, skinny_i8.hpp): the quantized
// values are within half a step of the weights; the kernel equals the
// product with the dequantized weights for every row count and ragged K; the
// general path (more rows), views and row slices keep the scales; views that
// would cut rows apart are refused. (Embedding lookups: test_generation.)
TEST_CASE("int8 rows: quantization, the skinny kernel and the general path", "[cpu][matmul][i8]") {
  for (int64_t K : {1, 15, 16, 17, 48, 771}) {
    const int64_t N = 67;
    const Tensor w = values(Shape{N, K}, uint64_t(K + 5));
    const Tensor q = quantize_rows(w);
    REQUIRE(q.dtype() == DType::i8);
    REQUIRE(row_scales(q) != nullptr);
    const Tensor back = q.to(DType::f32);
    for (int64_t n = 0; n < N; ++n) {
      const float step = row_scales(q)->data<float>()[n];
      for (int64_t k = 0; k < K; ++k)
        REQUIRE(std::abs(back.data<float>()[n * K + k] - w.data<float>()[n * K + k]) <=
                0.5f * step * (1 + 1e-6f));
    }
    for (int64_t M = 1; M <= cpu::kSkinnyRows + 3; ++M) {
      const Tensor x = values(Shape{M, K}, uint64_t(K * 100 + M));
      const Tensor y = cpu::matmul(x, q, false, true);  // skinny up to kSkinnyRows, then GEMM
      INFO("M " << M << " K " << K);
      CHECK(max_rel_error(y.data<float>(), x, back, M, N, K, N) < 1e-5);
    }
  }
  const Tensor q = quantize_rows(values(Shape{6, 4}, 3));
  CHECK(q.view({6, 2, 2}).to(DType::f32).view({6, 4}).to_vector() == q.to(DType::f32).to_vector());
  CHECK(q.slice0(2, 5).to(DType::f32).to_vector() == q.to(DType::f32).slice0(2, 5).to_vector());
  CHECK_THROWS_WITH(q.view({4, 6}), Catch::Contains("per row"));
  // Copies keep the scales: a clone, and a copy into another int8 tensor.
  CHECK(q.clone().to(DType::f32).to_vector() == q.to(DType::f32).to_vector());
  Tensor into = Tensor::empty(q.shape(), DType::i8);
  into.copy_from(q);
  CHECK(into.to(DType::f32).to_vector() == q.to(DType::f32).to_vector());
  CHECK_THROWS_WITH(into.copy_from(Tensor::zeros(q.shape())), Catch::Contains("quantize_rows"));
}

TEST_CASE("int8 rows: prefill kernels, exact per row or on AMX, never widening the weight",
          "[cpu][matmul][i8]") {
  const bool amx = cpu::best_prefill_unit() == cpu::PrefillUnit::amx;
  for (int64_t K : {15, 48, 771})
    for (int64_t M : {17, 40, 70}) {
      const int64_t N = 67, ldy = N + 2;  // two weight blocks and a ragged one; gaps in y
      const Tensor q = quantize_rows(values(Shape{N, K}, uint64_t(K + 11)));
      const Tensor back = q.to(DType::f32), x = values(Shape{M, K}, uint64_t(K * 10 + M));
      const auto* qp = static_cast<const int8_t*>(q.raw());
      const float* scale = row_scales(q)->data<float>();
      INFO("M " << M << " K " << K);
      // The decode kernel in blocks: each row the bits the decode kernel gives it alone.
      std::vector<float> y(size_t(M * ldy), -7.f), alone(size_t(N), 0.f);
      cpu::prefill_matmul_i8(x.data<float>(), K, qp, K, scale, y.data(), ldy, M, N, K,
                             cpu::PrefillUnit::none);
      CHECK(max_rel_error(y.data(), x, back, M, N, K, ldy) < 1e-5);
      for (int64_t m = 0; m < M; ++m) {
        cpu::skinny_matmul_i8(x.data<float>() + m * K, K, qp, K, scale, alone.data(), N, 1, N, K);
        for (int64_t n = 0; n < N; ++n) REQUIRE(y[size_t(m * ldy + n)] == alone[size_t(n)]);
        for (int64_t n = N; n < ldy; ++n) REQUIRE(y[size_t(m * ldy + n)] == -7.f);
      }
      // Through the matmul: the decode kernel below kPrefillRows, AMX from there.
      const Tensor ym = cpu::matmul(x, q, false, true);
      CHECK(max_rel_error(ym.data<float>(), x, back, M, N, K, N) < (amx ? 4e-3 : 1e-5));
      if (!amx) continue;
      // AMX: the product of bf16-rounded activations, a row's bits the same alone.
      const Tensor x16 = x.to(DType::bf16).to(DType::f32);
      std::vector<float> ya(size_t(M * ldy), -7.f), one(size_t(ldy), -7.f);
      cpu::prefill_matmul_i8(x.data<float>(), K, qp, K, scale, ya.data(), ldy, M, N, K,
                             cpu::PrefillUnit::amx);
      CHECK(max_rel_error(ya.data(), x16, back, M, N, K, ldy) < 1e-5);
      for (int64_t m = 0; m < M; ++m) {
        cpu::prefill_matmul_i8(x.data<float>() + m * K, K, qp, K, scale, one.data(), ldy, 1, N, K,
                               cpu::PrefillUnit::amx);
        for (int64_t n = 0; n < N; ++n) REQUIRE(ya[size_t(m * ldy + n)] == one[size_t(n)]);
        for (int64_t n = N; n < ldy; ++n) REQUIRE(ya[size_t(m * ldy + n)] == -7.f);
        if (M >= cpu::kPrefillRows && cpu::prefill_unit() == cpu::PrefillUnit::amx)
          for (int64_t n = 0; n < N; ++n)
            REQUIRE(ym.data<float>()[m * N + n] == ya[size_t(m * ldy + n)]);
      }
    }
}

}  // namespace redco
