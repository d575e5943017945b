#include "redco/models/pretrained.hpp"

#include <fmt/format.h>

namespace redco::models {

AnyPretrained from_pretrained_any(const std::filesystem::path& dir, const hf::LoadOptions& opts) {
  const hf::Config config(dir);
  return with_family(config.model_type(), config.source(),
                     [&]<typename M>() { return AnyPretrained(from_pretrained<M>(dir, opts)); });
}

std::vector<shard::ParamSplit> checkpoint_plan(const std::filesystem::path& dir, int n_shards) {
  const hf::Config config(dir);
  return with_family(config.model_type(), config.source(), [&]<typename M>() {
    return shard::resolve(HfFamily<M>::build(HfFamily<M>::config(config)), n_shards);
  });
}

}  // namespace redco::models
