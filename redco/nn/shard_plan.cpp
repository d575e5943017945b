// Applying a typed model's plan to its run-time sizes.
#include "redco/nn/shard_plan.hpp"

#include <fmt/format.h>

#include <map>

namespace redco::shard {
namespace {

// Empty if `e` splits evenly into n shards, else why not.
std::string why_not_divisible(const nn::ParamEntry& e, int n_shards) {
  const int d = split_dim_of(e.role);
  if (d < 0 || d >= e.shape.rank) return {};
  const int64_t size = e.shape.d[size_t(d)];
  if (size % (int64_t(n_shards) * e.unit) == 0) return {};
  if (e.unit > 1)
    return fmt::format("{} dim {} = {} is not divisible into {} shards of whole {}-wide heads",
                       e.name.view(), d, size, n_shards, e.unit);
  return fmt::format("{} dim {} = {} is not divisible by {} shards", e.name.view(), d, size,
                     n_shards);
}

}  // namespace

std::vector<ParamSplit> resolve(const std::vector<nn::ParamEntry>& entries, int n_shards) {
  REDCO_CHECK(n_shards >= 1, "the number of model shards must be >= 1, got {}", n_shards);
  std::map<int, std::string> group_failure;  // group -> the first reason it cannot split
  for (const auto& e : entries) {
    if (e.group < 0 || group_failure.count(e.group)) continue;
    if (std::string why = why_not_divisible(e, n_shards); !why.empty())
      group_failure[e.group] = std::move(why);
  }
  std::vector<ParamSplit> out;
  for (const auto& e : entries) {
    ParamSplit s{std::string(e.name.view()), e.shape.shape(), e.role, split_dim_of(e.role), {}};
    if (n_shards == 1) s.split_dim = -1;
    auto failed = group_failure.find(e.group);
    if (s.split_dim >= 0 && failed != group_failure.end()) {
      s.split_dim = -1;
      s.note = "replicated: " + failed->second;
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string describe_collectives(std::span<const nn::CollectiveEntry> collectives) {
  std::string out;
  for (const auto& c : collectives) {
    const std::string_view where = c.where.view().empty() ? "(model input)" : c.where.view();
    switch (c.kind) {
      case nn::Collective::enter_parallel:
        out +=
            fmt::format("  enter {}: identity forward, all-reduce of the input gradient\n", where);
        break;
      case nn::Collective::all_reduce:
        out += fmt::format("  leave {}: all-reduce forward\n", where);
        break;
      case nn::Collective::all_gather:
        out += fmt::format("  before {}: all-gather split features\n", where);
        break;
      case nn::Collective::vocab_logits:
        out += fmt::format("  {}: logits stay split by vocabulary (loss all-reduces max and sum)\n",
                           c.where.view().empty() ? "lm head" : c.where.view());
        break;
    }
  }
  return out;
}

}  // namespace redco::shard

namespace redco::nn {

std::shared_ptr<const SplitTable> split_table(const std::vector<ParamEntry>& entries,
                                              int n_shards) {
  auto table = std::make_shared<SplitTable>();
  for (shard::ParamSplit& s : shard::resolve(entries, n_shards))
    table->emplace(std::move(s.name), s.split_dim);
  return table;
}

}  // namespace redco::nn
