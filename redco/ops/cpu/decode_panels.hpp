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

// The same for int8: a floating CPU matrix [N, K] quantized by rows as
// quantize_rows does (one symmetric scale per row, the same int8 values),
// stored in int8 panels (panel_layout.hpp, panels::i8) that the int8 decode
// GEMV (skinny_i8_panels.hpp) reads as one stream. to(f32 / bf16) gives the
// scaled values back row-major; other reads are refused as for bf16 panels.
Tensor pack_panels_i8(const Tensor& w);
// True for a pack_panels_i8 tensor.
bool in_i8_panels(const Tensor& t);
// Its packed storage ([padded_rows(N), K] int8 in panel order) and its row scales (f32 [N]).
const int8_t* i8_panel_data(const Tensor& t);
const float* i8_panel_scales(const Tensor& t);

}  // namespace redco
