#include "redco/shard/split.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "redco/core/error.hpp"

namespace redco::shard {

Shape shard_shape(const ParamSplit& p, int n_shards) {
  REDCO_CHECK(n_shards >= 1, "a shard plan needs at least one shard, got {}", n_shards);
  if (p.split_dim < 0) return p.shape;
  return p.shape.with(p.split_dim, p.shape[p.split_dim] / n_shards);
}

IndexRange shard_range(const ParamSplit& p, int n_shards, int shard) {
  REDCO_CHECK(shard >= 0 && shard < n_shards, "shard {} is out of range for {} shards", shard,
              n_shards);
  REDCO_CHECK(p.split_dim >= 0, "'{}' is replicated: every shard holds it whole", p.name);
  const int64_t per = p.shape[p.split_dim] / n_shards;
  return {shard * per, (shard + 1) * per};
}

std::string describe(const std::vector<ParamSplit>& plan, int n_shards) {
  std::vector<std::array<std::string, 5>> rows{
      {"parameter", "shape", "role", "split", "bytes/shard (f32)"}};
  int64_t whole = 0, per_shard = 0;
  for (const ParamSplit& p : plan) {
    const int64_t bytes = shard_shape(p, n_shards).numel() * 4;
    whole += p.shape.numel() * 4;
    per_shard += bytes;
    const std::string split = p.split_dim < 0 ? "-" : fmt::format("dim {}", p.split_dim);
    rows.push_back(
        {p.name, p.shape.str(), std::string(role_name(p.role)), split, std::to_string(bytes)});
  }
  std::array<size_t, 5> width{};
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string text;
  for (const auto& r : rows)
    text += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {:>{}}\n", r[0], width[0], r[1], width[1],
                        r[2], width[2], r[3], width[3], r[4], width[4]);
  text += fmt::format("total: {} bytes per shard of {} ({} shards)\n", per_shard, whole, n_shards);
  for (const ParamSplit& p : plan)
    if (!p.note.empty()) text += "note: " + p.note + "\n";
  return text;
}

}  // namespace redco::shard
