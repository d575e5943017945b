// Is int8 weight-only decoding worth adding? One decoded token of a
// LLaMA-shaped model is, on the CPU, the weight-streaming GEMVs of its layers
// (attention q/k/v/o [d, d], MLP gate/up [h, d], down [d, h]); this times
// them with the weights in f32 and bf16 through redco::linear (the path
// generation takes: sgemm, and the skinny bf16 kernel) against an int8
// kernel with per-output-channel symmetric scales and f32 accumulation
// (AVX2: 8 weights widened to f32 per FMA), and prints tokens/s for each.
// Attention over the cache, norms and the LM head are left out: they are
// the same for every weight format.
//
//   bench_int8_decode [--dim 2048] [--hidden 5632] [--layers 8] [--reps 5]
//
// The contenders take turns for --reps rounds and each keeps its best round,
// so a burst of load on a shared machine hits them alike.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "redco/autodiff/functional.hpp"
#include "redco/autodiff/node.hpp"
#include "redco/core/philox.hpp"
#include "redco/ops/cpu/parallel.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

using namespace redco;
using Clock = std::chrono::steady_clock;

namespace {

// w [N, K] as int8 with one scale per output row: w ~= q * scale.
struct Int8Weight {
  int64_t N, K;
  std::vector<int8_t> q;
  std::vector<float> scale;
};

Int8Weight quantize(const Tensor& w) {
  const int64_t N = w.dim(0), K = w.dim(1);
  Int8Weight out{N, K, std::vector<int8_t>(size_t(N * K)), std::vector<float>(size_t(N))};
  const float* src = w.data<float>();
  for (int64_t n = 0; n < N; ++n) {
    float amax = 0.f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::abs(src[n * K + k]));
    const float s = amax > 0.f ? amax / 127.f : 1.f;
    out.scale[size_t(n)] = s;
    for (int64_t k = 0; k < K; ++k)
      out.q[size_t(n * K + k)] = int8_t(std::lrint(src[n * K + k] / s));
  }
  return out;
}

// y[n] = scale[n] * sum_k x[k] * q[n, k] for one row x (a decode step).
void gemv_int8(const float* x, const Int8Weight& w, float* y) {
  const int64_t K = w.K;
  cpu::parallel_chunks(w.N, cpu::grain_for(int64_t(1) << 16, K), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* row = w.q.data() + n * K;
      float s = 0.f;
      int64_t k = 0;
#if defined(__AVX2__) && defined(__FMA__)
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      for (; k + 16 <= K; k += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(row + k) + 2048, _MM_HINT_T0);
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
        const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k + 8), a1);
      }
      const __m256 a = _mm256_add_ps(a0, a1);
      const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
      const __m128 t = _mm_add_ps(h, _mm_movehl_ps(h, h));
      s = _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
#endif
      for (; k < K; ++k) s += x[k] * float(row[k]);
      y[n] = s * w.scale[size_t(n)];
    }
  });
}

int64_t flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return std::atoll(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t d = flag(argc, argv, "--dim", 2048), h = flag(argc, argv, "--hidden", 5632),
                layers = flag(argc, argv, "--layers", 8), reps = flag(argc, argv, "--reps", 5);
  NoGradGuard no_grad;
  std::vector<Tensor> f32, bf16;
  std::vector<Int8Weight> i8;
  for (int64_t l = 0; l < layers; ++l)
    for (auto [n, k] : {std::pair{d, d}, std::pair{d, d}, std::pair{d, d}, std::pair{d, d},
                        std::pair{h, d}, std::pair{h, d}, std::pair{d, h}}) {
      Tensor w = Tensor::empty({n, k});
      philox_uniform(w.data<float>(), n * k, 7, uint64_t(f32.size()), 0, -0.05f, 0.05f);
      i8.push_back(quantize(w));
      bf16.push_back(w.to(DType::bf16));
      f32.push_back(std::move(w));
    }
  Tensor xd = Tensor::empty({1, d}), xh = Tensor::empty({1, h});  // the two input widths
  philox_uniform(xd.data<float>(), d, 9, 0, 0, -1.f, 1.f);
  philox_uniform(xh.data<float>(), h, 9, 1, 0, -1.f, 1.f);
  std::vector<float> y(size_t(std::max(d, h)));
  // One token's GEMVs in each format.
  auto token = [&](int which) {
    for (size_t i = 0; i < f32.size(); ++i) {
      const Tensor& in = f32[i].dim(1) == d ? xd : xh;
      if (which == 0) (void)linear(in, f32[i]);
      if (which == 1) (void)linear(in, bf16[i]);
      if (which == 2) gemv_int8(in.data<float>(), i8[i], y.data());
    }
  };
  // The int8 products against f32's: the kernel computes what it should.
  double err = 0, ref = 0;
  const Tensor want = linear(xh, f32.back());
  gemv_int8(xh.data<float>(), i8.back(), y.data());
  for (int64_t n = 0; n < d; ++n) {
    err = std::max(err, double(std::abs(y[size_t(n)] - want.data<float>()[n])));
    ref = std::max(ref, double(std::abs(want.data<float>()[n])));
  }
  double best[3] = {1e30, 1e30, 1e30};
  for (int w = 0; w < 3; ++w) token(w);  // warm-up
  for (int64_t r = 0; r < reps; ++r)
    for (int w = 0; w < 3; ++w) {
      const auto t0 = Clock::now();
      token(w);
      best[w] = std::min(best[w], std::chrono::duration<double>(Clock::now() - t0).count());
    }
  const double params = double(layers) * double(4 * d * d + 3 * h * d);
  std::printf(
      "{\"params_M\": %.0f, \"f32_tok_s\": %.2f, \"bf16_tok_s\": %.2f, \"int8_tok_s\": %.2f, "
      "\"int8_vs_bf16\": %.2f, \"int8_max_abs_err\": %.2e, \"max_abs_out\": %.2e}\n",
      params / 1e6, 1 / best[0], 1 / best[1], 1 / best[2], best[1] / best[2], err, ref);
  return 0;
}
