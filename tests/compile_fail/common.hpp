#pragma once
// Shared by the compile-fail programs: a model, examples and batches that are
// right, so each program gets exactly one thing wrong.
#include <span>
#include <vector>

#include "redco/train/trainer.hpp"

namespace cf {
using namespace redco;
using namespace redco::train;

struct Example {
  float x[4];
  int64_t y;
};
struct Batch {
  Tensor x, y;
};

inline const auto model = nn::linear(4, 8) | nn::relu() | nn::linear(8, 2);

inline Batch collate(std::span<const Example> ex) {
  return {Tensor::zeros({int64_t(ex.size()), 4}), Tensor::zeros({int64_t(ex.size())}, DType::i64)};
}
inline const auto loss = [](auto& m, const Batch& b, Rng) { return cross_entropy(m(b.x), b.y); };
inline const auto predict = [](auto& m, const Batch& b, Rng) {
  return argmax(m(b.x), 1).template values<int64_t>();
};
}  // namespace cf
