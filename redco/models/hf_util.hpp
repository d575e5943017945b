#pragma once
// Small pieces every Hugging Face family adapter uses.
#include <numeric>
#include <string>
#include <vector>

#include "redco/models/hf_checkpoint.hpp"
#include "redco/nn/layers.hpp"

namespace redco::models::hf {

// [begin, end) as a row list.
inline std::vector<int64_t> row_range(int64_t begin, int64_t end) {
  std::vector<int64_t> r(size_t(end - begin));
  std::iota(r.begin(), r.end(), begin);
  return r;
}

// transformers' ACT2FN names -> redco's activations; throws naming the key otherwise.
nn::Act activation(const Config& config, std::string_view key, std::string_view fallback);
// The inverse, for config.json.
std::string activation_name(nn::Act a);

}  // namespace redco::models::hf
