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
  // Optional: batch row b sees only keys [key_begin[b], key_end[b]) (padding
  // on either side); null: all keys.
  const int64_t* key_begin = nullptr;
  const int64_t* key_end = nullptr;
  // Optional: query i of batch row b sees keys j <= i + causal_offset[b]
  // (null: Tk - Tq, the queries being the last Tq positions).
  const int64_t* causal_offset = nullptr;
  // Optional: [Hq, Tq, Tk] added to the scaled scores (T5's position bias),
  // or [B, Hq, Tq, Tk] with bias_per_row (a KV cache's rows at their own
  // positions).
  const float* bias = nullptr;
  bool bias_per_row = false;
  // Optional, decoding only: a paged KV cache. k and v are then pools of
  // blocks [N, Hkv, block, D]; key j of batch row b lies in block
  // block_table[b * blocks_per_row + j / block] at j % block, and
  // Tk = blocks_per_row * block (entries past the row's keys are not read).
  const int64_t* block_table = nullptr;
  int64_t block = 0, blocks_per_row = 0;
};

void flash_attention_forward(const AttentionShape& s, const float* q, const float* k,
                             const float* v, float* o, float* lse);

// Gradients are written (not accumulated) into dq [B,Hq,Tq,D], dk/dv [B,Hkv,Tk,D].
void flash_attention_backward(const AttentionShape& s, const float* q, const float* k,
                              const float* v, const float* o, const float* lse, const float* dout,
                              float* dq, float* dk, float* dv, float* dbias = nullptr);
// dbias, with a bias: [B, Hq, Tq, Tk], each batch row's gradient of the bias
// (the caller sums over B); entries no query sees are zero.

// Decoding: a few query rows against a KV cache. The same results as
// flash_attention_forward up to rounding, with k and v read once as stored:
// f32, or bf16 (kv_bf16: a bf16 cache, widened in registers).
// use_decode_attention says when it is the faster kernel (Tq small). The
// only kernel that reads a paged cache (AttentionShape::block_table).
constexpr int64_t kDecodeQueryRows = 4;
bool use_decode_attention(const AttentionShape& s);
void decode_attention_forward(const AttentionShape& s, const float* q, const void* k, const void* v,
                              bool kv_bf16, float* o, float* lse);

}  // namespace redco::cpu
