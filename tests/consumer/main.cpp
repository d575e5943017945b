// Smoke test for consuming redco as a Meson subproject: the headers resolve
// as "redco/...", and both a header-only part (Philox) and compiled kernels
// (sgemm, philox_uniform) link.
#include <cstdio>

#include "redco/core/philox.hpp"
#include "redco/ops/cpu/gemm.hpp"

int main() {
  // Random123 known-answer vector for Philox-4x32-10.
  const redco::PhiloxCounter got = redco::philox4x32_10(
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0});
  const redco::PhiloxCounter want = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
  if (got != want) {
    std::puts("consumer: philox4x32_10 known-answer mismatch");
    return 1;
  }

  float u[4];
  redco::philox_uniform(u, 4, 7, redco::stream_of("consumer"), 0, 0.0f, 1.0f);
  for (float x : u) {
    if (!(x >= 0.0f && x < 1.0f)) {
      std::printf("consumer: philox_uniform gave %g outside [0, 1)\n", x);
      return 1;
    }
  }

  const float A[4] = {1, 2, 3, 4}, B[4] = {5, 6, 7, 8};
  float C[4] = {0, 0, 0, 0};
  redco::cpu::sgemm(false, false, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2);
  const float expect[4] = {19, 22, 43, 50};
  std::printf("consumer: sgemm [[1,2],[3,4]] x [[5,6],[7,8]] = [[%g,%g],[%g,%g]]\n", C[0], C[1],
              C[2], C[3]);
  for (int i = 0; i < 4; ++i) {
    if (C[i] != expect[i]) {
      std::puts("consumer: wrong sgemm result, expected [[19,22],[43,50]]");
      return 1;
    }
  }
  std::puts("consumer: ok");
  return 0;
}
