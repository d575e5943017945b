#pragma once
// --n-model-shards N or auto, as the transformer samples take it: auto hands
// the choice of shards, ZeRO stage, micro-batch and recomputation to the
// planner (DeployerConfig::auto_mesh, docs/planning.md).
#include <optional>
#include <string>

#include "redco/core/error.hpp"

namespace redco::sample {

// The shard count, or nullopt for auto.
inline std::optional<int> model_shards(const std::string& text) {
  if (text == "auto") return std::nullopt;
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  REDCO_CHECK(used == text.size() && used > 0 && n >= 1,
              "--n-model-shards '{}': give a number >= 1, or auto", text);
  return n;
}

}  // namespace redco::sample
