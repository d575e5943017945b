#pragma once
// A loss read from a tensor's parts. A tensor with a Placement
// (core/tensor.hpp) holds only this rank's part of its values, or none yet;
// the core knows no losses, so a placement that can give cross_entropy
// without forming the whole tensor says so by also implementing this
// interface (nn's vocabulary-split logits and an LM head's deferred logits
// do). cross_entropy finds it by dynamic_cast; any other placement's tensor
// is made whole first.
#include <cstdint>

#include "redco/core/tensor.hpp"

namespace redco {

struct CrossEntropyOnParts {
  virtual ~CrossEntropyOnParts() = default;
  // cross_entropy(whole(logits), labels, ignore_index), without whole(logits).
  virtual Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                               int64_t ignore_index) const = 0;
};

}  // namespace redco
