#pragma once
// Weight-only int8 for inference: a floating [rows, ...] tensor as i8 with
// one symmetric scale per row (max |row| / 127), so a decode step streams a
// byte a weight (skinny_i8.hpp). The storage is the int8 values row by row;
// views that keep the rows and row slices keep the scales; to(f32) /
// to(bf16) give back the scaled values.
#include "redco/core/tensor.hpp"

namespace redco {

// A floating CPU tensor of rank >= 2, quantized.
Tensor quantize_rows(const Tensor& w);
// i8 rows q [rows, ...] and their scales f32 [rows] as one such tensor.
Tensor quantized_rows(const Tensor& q, const Tensor& scales);
// The scales of a quantize_rows tensor (f32 [rows]); null for any other.
const Tensor* row_scales(const Tensor& t);

}  // namespace redco
