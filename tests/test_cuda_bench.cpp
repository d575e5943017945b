// Throughput of the CUDA kernels a GPT-2 124M step (batch 16 x 1024, bf16
// mixed precision) spends its time in: hidden cases ([.bench]) that
// tools/gpu-check runs on a GPU and reports as warnings. Without a GPU each
// case exits 77 (Meson's SKIP) through REQUIRE_GPU (cuda_test_util.hpp,
// test::skip), never passes.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>

#include "cuda_test_util.hpp"  // REQUIRE_GPU: test::skip, exit 77, without a GPU
#include "redco/ops/backend.hpp"
#include "redco/ops/cuda/cuda_backend.hpp"

namespace redco {
namespace {
using namespace cuda_test;

TEST_CASE("cuda: attention throughput", "[cuda][.bench]") {
  REQUIRE_GPU();
  const int64_t B = 16, H = 12, T = 1024, D = 64;  // GPT-2 124M at batch 16 x 1024
  for (int variant = 0; variant < 3; ++variant) {  // f32, bf16, bf16 on the flash kernels
    const DType dt = variant == 0 ? DType::f32 : DType::bf16;
    if (variant == 2) setenv("REDCO_CUDA_ATTENTION", "flash", 1);
    const Tensor q = dev(rnd({B, H, T, D}, 160)).to(dt), k = dev(rnd({B, H, T, D}, 161)).to(dt),
                 v = dev(rnd({B, H, T, D}, 162)).to(dt), dout = dev(rnd({B, H, T, D}, 163));
    Tensor lse;
    const Tensor o = gpu().attention(q, k, v, true, 0.125f, lse, {});
    double ms[2] = {0, 0};
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < 2; ++i) {  // warm-up, then timed
        cuda::synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < 5; ++r) {
          if (pass == 0)
            gpu().attention(q, k, v, true, 0.125f, lse, {});
          else
            gpu().attention_backward(q, k, v, o, lse, dout, true, 0.125f, {});
        }
        cuda::synchronize();
        ms[pass] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count() /
                   5;
      }
    }
    unsetenv("REDCO_CUDA_ATTENTION");
    WARN("attention " << B << "x" << H << "x" << T << "x" << D << " causal " << dtype_name(dt)
                      << (variant == 2 ? " (flash kernels)" : "") << ": forward " << ms[0]
                      << " ms, backward " << ms[1] << " ms");
  }
}

// The GEMMs of a GPT-2 124M step at batch 16 x 1024 under bf16 mixed
// precision, each as the step calls it (f32 operands rounded per call) and on
// operands already bf16: where a step's matmul time goes.
TEST_CASE("cuda: GPT-2 step GEMMs under bf16", "[cuda][.bench]") {
  REQUIRE_GPU();
  struct Case {
    const char* name;
    int64_t M, N, K;
    bool ta, tb;
  };
  const Case cases[] = {{"qkv x w^T", 16384, 2304, 768, false, true},
                        {"fc2 x w^T", 16384, 768, 3072, false, true},
                        {"dW = dy^T x (fc1)", 3072, 768, 16384, true, false},
                        {"head chunk 336 rows", 336, 50257, 768, false, true},
                        {"head chunk 2400 rows", 2400, 50257, 768, false, true},
                        {"head chunk, vocab padded to 50304", 2400, 50304, 768, false, true},
                        {"head chunk as (w x^T)", 50257, 2400, 768, false, true}};
  PrecisionGuard mixed(Precision::bf16);
  for (const Case& c : cases) {
    const Tensor a = dev(rnd(c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, 170));
    const Tensor b = dev(rnd(c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, 171));
    for (bool pre : {false, true}) {
      const Tensor x = pre ? a.to(DType::bf16) : a, y = pre ? b.to(DType::bf16) : b;
      gpu().matmul(x, y, c.ta, c.tb);
      cuda::synchronize();
      const int iters = 20;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) gpu().matmul(x, y, c.ta, c.tb);
      cuda::synchronize();
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      WARN(c.name << " [" << c.M << ", " << c.N << ", " << c.K << "] "
                  << (pre ? "bf16 operands" : "f32 operands") << ": " << s * 1e3 << " ms, "
                  << 2.0 * double(c.M * c.N * c.K) / s / 1e12 << " TFLOP/s");
    }
  }
}

TEST_CASE("cuda: matmul throughput", "[cuda][.bench]") {
  REQUIRE_GPU();
  const int64_t M = 4096, N = 3072, K = 768;
  const Tensor a = dev(rnd({M, K}, 150)), b = dev(rnd({K, N}, 151));
  for (int mode = 0; mode < 3; ++mode) {
    cuda::set_allow_tf32(mode == 1);
    const Tensor x = mode == 2 ? a.to(DType::bf16) : a, y = mode == 2 ? b.to(DType::bf16) : b;
    for (int i = 0; i < 3; ++i) gpu().matmul(x, y, false, false);
    cuda::synchronize();
    const int iters = 50;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) gpu().matmul(x, y, false, false);
    cuda::synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const char* names[] = {"fp32", "tf32", "bf16 (fp32 accumulate)"};
    WARN("matmul " << M << "x" << N << "x" << K << " " << names[mode] << ": "
                   << 2.0 * M * N * K * iters / s / 1e12 << " TFLOP/s");
  }
  cuda::set_allow_tf32(false);
}

}  // namespace
}  // namespace redco
