#pragma once
// The CUDA optimizer kernels (optim_update.cu); every pointer on the device.
#include <cstdint>

#include "redco/ops/optim_update.hpp"

namespace redco::cuda::k {

void sgd_update(float* p, const float* g, float* buf, const SgdCoeffs& c, int64_t n);
void adam_update(float* p, const float* g, float* m, float* v, const AdamCoeffs& c, int64_t n);
// The partials scratch sum_of_squares needs for n elements (doubles).
int64_t squares_blocks(int64_t n);
// *out = sum of x[i]^2 in double, through `partials` [blocks], in a fixed order.
void sum_of_squares(const float* x, int64_t n, double* partials, int64_t blocks, double* out);

}  // namespace redco::cuda::k
