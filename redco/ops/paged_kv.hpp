#pragma once
// A paged KV cache as attention reads it (AttentionExtras::block_table).
//
//   k, v   [N, Hkv, block, D]   pools of N blocks of `block` tokens each
//   table  i64 [B, M] (host)    row b's keys j live in block table[b, j / block]
//                               at j % block; Tk = M * block; -1: no block
//
// The backends share these two: the checks (before any kernel runs) and, for a
// kernel that reads contiguous keys only, the blocks gathered into rows.
#include "redco/core/tensor.hpp"

namespace redco {

// Checks q [B, Hq, Tq, D] against the pools and the table (dtypes, shapes,
// every entry in [-1, N)); `op` names the caller in the message.
void check_paged_kv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& table);

// The pool's blocks in each row's order: [B, Hkv, M * block, D] on the pool's
// device, zeros where the table has no block.
Tensor gather_paged_kv(const Tensor& pool, const Tensor& table);

}  // namespace redco
