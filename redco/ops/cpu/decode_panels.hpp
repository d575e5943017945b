#pragma once
// Decoding against bf16 weights at a batch of several sequences: a floating
// CPU matrix [N, K] as bf16 stored in panels (panel_layout.hpp), which the
// decode GEMV (skinny_panels.hpp) reads as one stream with no wasted issue
// slots. Same values and bytes as to(DType::bf16); to(any dtype) gives them
// back row-major; matmul with it as the transposed right operand (a linear
// layer's weight) reads the panels; the embedding lookup gathers its rows.
// Other reads of the storage are refused (it is not row-major): views other
// than the whole matrix, slices and moves off the CPU too.
#include <cstdint>

#include "redco/core/tensor.hpp"

namespace redco {

Tensor pack_panels(const Tensor& w);
// True for a pack_panels tensor.
bool in_panels(const Tensor& t);
// The packed storage ([padded_rows(N), K] bf16 in panel order) of a pack_panels tensor.
const uint16_t* panel_data(const Tensor& t);

}  // namespace redco
