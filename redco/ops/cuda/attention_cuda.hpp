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

// The longest key sequence the kernels take: a query row's scores (and, in
// the backward, its dP) live in 48 KiB of shared memory.
constexpr int64_t kMaxAttentionKeys = 6144;

// q, o [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D]; lse [B, Hq, Tq].
void attention_forward(const AttentionArgs& a, const float* q, const float* k, const float* v,
                       float* o, float* lse);
// Writes dq, dk, dv, and (if non-null) dbias [B, Hq, Tq, Tk] per batch row.
// P and dS are scratch of B*Hq*Tq*Tk floats each.
void attention_backward(const AttentionArgs& a, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* dout, float* dq, float* dk,
                        float* dv, float* P, float* dS, float* dbias);

}  // namespace redco::cuda::k
