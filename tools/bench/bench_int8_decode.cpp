// The weight-streaming products of decoding, per weight format. One decoded
// token of a LLaMA-shaped model is, on the CPU, the GEMVs of its layers
// (attention q/k/v/o [d, d], MLP gate/up [h, d], down [d, h]) against the
// batch's rows; this times them through redco::linear (the path generation
// takes: the skinny f32, bf16, int8 and panel kernels) with the weights in
// f32, bf16, int8 (quantize_rows), bf16 packed in decode panels
// (pack_panels) and int8 in decode panels (pack_panels_i8), and prints
// tokens/s for each and the
// bytes of weights streamed a second. Attention over the cache, norms and the
// LM head are left out: they are the same for every weight format.
//
//   bench_int8_decode [--dim 2048] [--hidden 5632] [--kv-dim 2048] [--layers 8] [--batch 1]
//                     [--reps 5]
// (LLaMA 1.1B: --kv-dim 256 --layers 22, whose weights no cache holds.)
//
// The contenders take turns for --reps rounds and each keeps its best round,
// so a burst of load on a shared machine hits them alike.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "redco/autodiff/functional.hpp"
#include "redco/autodiff/node.hpp"
#include "redco/core/philox.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"

using namespace redco;
using Clock = std::chrono::steady_clock;

namespace {

int64_t flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return std::atoll(argv[i + 1]);
  return fallback;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, double(std::abs(a.data<float>()[i] - b.data<float>()[i])));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t d = flag(argc, argv, "--dim", 2048), h = flag(argc, argv, "--hidden", 5632),
                layers = flag(argc, argv, "--layers", 8), batch = flag(argc, argv, "--batch", 1),
                reps = flag(argc, argv, "--reps", 5), kv = flag(argc, argv, "--kv-dim", d);
  NoGradGuard no_grad;
  constexpr int kFormats = 5;
  std::vector<Tensor> weights[kFormats];  // f32, bf16, int8, bf16 in panels, int8 in panels
  for (int64_t l = 0; l < layers; ++l)
    for (auto [n, k] : {std::pair{d, d}, std::pair{kv, d}, std::pair{kv, d}, std::pair{d, d},
                        std::pair{h, d}, std::pair{h, d}, std::pair{d, h}}) {
      Tensor w = Tensor::uniform({n, k}, 7, uint64_t(weights[0].size()), -0.05f, 0.05f);
      weights[1].push_back(w.to(DType::bf16));
      weights[2].push_back(quantize_rows(w));
      weights[3].push_back(pack_panels(w));
      weights[4].push_back(pack_panels_i8(w));
      weights[0].push_back(std::move(w));
    }
  // The two input widths, `batch` rows each.
  const Tensor xd = Tensor::uniform({batch, d}, 9, 0, -1.f, 1.f),
               xh = Tensor::uniform({batch, h}, 9, 1, -1.f, 1.f);
  auto token = [&](int format) {  // one token's products in one format
    for (const Tensor& w : weights[format]) (void)linear(w.dim(1) == d ? xd : xh, w);
  };
  // The formats' products against f32's: each kernel computes what it should.
  const Tensor want = linear(xh, weights[0].back());
  const double err_bf16 = max_abs_diff(linear(xh, weights[1].back()), want),
               err_i8 = max_abs_diff(linear(xh, weights[2].back()), want),
               err_panels = max_abs_diff(linear(xh, weights[3].back()), want),
               err_i8_panels = max_abs_diff(linear(xh, weights[4].back()), want);
  double best[kFormats] = {1e30, 1e30, 1e30, 1e30, 1e30};
  for (int f = 0; f < kFormats; ++f) token(f);  // warm-up
  for (int64_t r = 0; r < reps; ++r)
    for (int f = 0; f < kFormats; ++f) {
      const auto t0 = Clock::now();
      token(f);
      best[f] = std::min(best[f], std::chrono::duration<double>(Clock::now() - t0).count());
    }
  const double params = double(layers) * double(2 * d * d + 2 * kv * d + 3 * h * d);
  std::printf(
      "{\"params_M\": %.0f, \"batch\": %lld, \"f32_tok_s\": %.2f, \"bf16_tok_s\": %.2f, "
      "\"int8_tok_s\": %.2f, \"panels_tok_s\": %.2f, \"i8_panels_tok_s\": %.2f, "
      "\"bf16_vs_f32\": %.2f, \"int8_vs_bf16\": %.2f, \"panels_vs_f32\": %.2f, "
      "\"i8_panels_vs_panels\": %.2f, \"weight_GB_s\": [%.1f, %.1f, %.1f, %.1f, %.1f], "
      "\"bf16_max_abs_err\": %.2e, \"int8_max_abs_err\": %.2e, \"panels_max_abs_err\": %.2e, "
      "\"i8_panels_max_abs_err\": %.2e}\n",
      params / 1e6, (long long)batch, 1 / best[0], 1 / best[1], 1 / best[2], 1 / best[3],
      1 / best[4], best[0] / best[1], best[1] / best[2], best[0] / best[3], best[3] / best[4],
      params * 4 / best[0] / 1e9, params * 2 / best[1] / 1e9, params / best[2] / 1e9,
      params * 2 / best[3] / 1e9, params / best[4] / 1e9, err_bf16, err_i8, err_panels,
      err_i8_panels);
  return 0;
}
