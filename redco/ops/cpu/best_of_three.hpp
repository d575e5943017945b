#pragma once
// The one-off timings kernels choose by (bf16 GEMM against sgemm, vdpbf16ps
// against the f32 chain): seconds of the best of three calls of `f` after one
// untimed call.
#include <algorithm>
#include <chrono>

namespace redco::cpu {

template <typename F>
double best_of_three(const F& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace redco::cpu
