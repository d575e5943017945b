#pragma once
// A language-model batch for the trainer tests: windows of 17 token ids
// become inputs (the first 16) and next-token targets (the last 16).
#include <algorithm>
#include <span>
#include <vector>

#include "redco/core/tensor.hpp"

namespace redco::test {

struct Window {
  std::vector<int64_t> ids;  // 17 tokens
};
struct LmBatch {
  Tensor inputs, targets;  // i64 [B, 16]
};

inline LmBatch collate_windows(std::span<const Window> ws) {
  const auto n = int64_t(ws.size());
  LmBatch b{Tensor::empty({n, 16}, DType::i64), Tensor::empty({n, 16}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(ws[size_t(i)].ids.begin(), 16, b.inputs.data<int64_t>() + i * 16);
    std::copy_n(ws[size_t(i)].ids.begin() + 1, 16, b.targets.data<int64_t>() + i * 16);
  }
  return b;
}

}  // namespace redco::test
