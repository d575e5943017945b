#pragma once
// Fused scaled-dot-product attention (flash-attention style tiling, online
// softmax): memory is O(T) per head, the T x T score matrix never exists.
#include <cstdint>

namespace redco::cpu {

// Layout (contiguous, row-major):
//   q   [B, Hq,  Tq, D]      k, v [B, Hkv, Tk, D]     (Hq % Hkv == 0: grouped-query
//   o   [B, Hq,  Tq, D]       attention; query head h reads kv head h / (Hq/Hkv))
//   lse [B, Hq,  Tq]          log-sum-exp of each query's scaled scores, saved
//                             by forward so backward can rebuild probabilities.
// causal: query i sees keys j <= i + (Tk - Tq) (queries are the last Tq
// positions, which also covers decoding with a KV cache).
struct AttentionShape {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  float scale;  // usually 1/sqrt(D)
  bool causal;
};

void flash_attention_forward(const AttentionShape& s, const float* q, const float* k,
                             const float* v, float* o, float* lse);

// Gradients are written (not accumulated) into dq [B,Hq,Tq,D], dk/dv [B,Hkv,Tk,D].
void flash_attention_backward(const AttentionShape& s, const float* q, const float* k,
                              const float* v, const float* o, const float* lse, const float* dout,
                              float* dq, float* dk, float* dv);

}  // namespace redco::cpu
