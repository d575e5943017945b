#pragma once
// Embedding lookup and its scatter-add backward.
#include <cstdint>

namespace redco::cpu {

// out[i, :] = table[ids[i], :] for i < n; table is [V, D]. An id outside [0, V)
// throws redco::Error naming the position and the id.
void embedding_forward(const float* table, const int64_t* ids, float* out, int64_t n, int64_t V,
                       int64_t D);
// The same from a bf16 table (inference weights): each row looked up is
// widened to f32 on the way out.
void embedding_forward_bf16(const uint16_t* table, const int64_t* ids, float* out, int64_t n,
                            int64_t V, int64_t D);
// And from a bf16 table packed in decode panels (pack_panels; a tied LM head).
void embedding_forward_panels(const uint16_t* panels, const int64_t* ids, float* out, int64_t n,
                              int64_t V, int64_t D);
// And from an int8 table quantized by rows (quantize_rows): row v
// is table[v] * scale[v].
void embedding_forward_i8(const int8_t* table, const float* scale, const int64_t* ids, float* out,
                          int64_t n, int64_t V, int64_t D);
// And from an int8 table packed in decode panels (pack_panels_i8; a tied LM head).
void embedding_forward_i8_panels(const int8_t* panels, const float* scale, const int64_t* ids,
                                 float* out, int64_t n, int64_t V, int64_t D);
// dtable[ids[i], :] += dout[i, :]. dtable is accumulated into (caller zeroes it).
// Deterministic: the result does not depend on thread scheduling.
void embedding_backward(const float* dout, const int64_t* ids, float* dtable, int64_t n, int64_t V,
                        int64_t D);

}  // namespace redco::cpu
