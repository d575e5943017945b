#pragma once
// Strided batched f32 GEMMs on cuBLAS for the backend's composite ops
// (attention): count row-major products C_i = alpha op(A_i) op(B_i), with
// A_i = A + i * sa, B_i = B + i * sb, C_i = C + i * sc (elements). lda, ldb,
// ldc are the row strides of A, B, C as stored (A is [K, M] when ta).
#include <cstdint>

#include "redco/core/device.hpp"

namespace redco::cuda {

struct StridedGemm {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t sa = 0, sb = 0, sc = 0, count = 1;
  float alpha = 1.f;
  bool tf32 = false;  // TF32 tensor cores (also when set_allow_tf32(true))
};
void gemm_f32(Device dev, const StridedGemm& g, const float* A, const float* B, float* C);

}  // namespace redco::cuda
