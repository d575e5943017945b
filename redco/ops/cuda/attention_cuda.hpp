#pragma once
// The CUDA attention kernels' view of one call (see attention.cu): shapes as
// the CPU kernel's (redco/ops/cpu/attention.hpp), every pointer on the device.
#include <cstdint>

namespace redco::cuda::k {

struct AttentionArgs {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  float scale;
  bool causal;
  const int64_t* key_begin = nullptr;  // [B] or null: all keys
  const int64_t* key_end = nullptr;
  const int64_t* causal_offset = nullptr;  // [B] or null: Tk - Tq
  const float* bias = nullptr;             // [Hq, Tq, Tk], or [B, Hq, Tq, Tk] with bias_per_row
  bool bias_per_row = false;
};

// S [B, Hq, Tq, Tk] holds scale * q . k; becomes P in place (0 off the
// visible keys). Forward: lse_out [B, Hq, Tq] written, lse_in null;
// backward: lse_out null, the saved lse_in read.
void attention_softmax_rows(const AttentionArgs& a, float* S, float* lse_out, const float* lse_in);
// dP [B, Hq, Tq, Tk] (= dO V^T) becomes dS = P (dP - Delta) in place;
// dbias [B, Hq, Tq, Tk] (may be null) receives a copy of dS.
void attention_grad_rows(const AttentionArgs& a, const float* P, float* dP, const float* o,
                         const float* dout, float* dbias);

// flash_attention.cu: the forward on bf16 q, k, v with the scores kept on
// chip (no bias; head size 64 or 128; 16-byte aligned rows). Not yet the
// default: see the file's STATUS.
bool flash_attention_supported(const AttentionArgs& a);
void flash_attention_forward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                             float* o, float* lse);
// flash_attention_bwd.cu: dq, dk, dv (f32) from bf16 q, k, v, the forward's o
// and lse, and dout (f32), at head size 64. Scratch: dout_bf16 [B*Hq*Tq*D]
// bf16, delta [B*Hq*Tq] f32.
bool flash_attention_backward_supported(const AttentionArgs& a);
void flash_attention_backward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                              const float* o, const float* lse, const float* dout, void* dout_bf16,
                              float* delta, float* dq, float* dk, float* dv);

}  // namespace redco::cuda::k
