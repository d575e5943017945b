// LoRA adapters: target matching, their plan entries and the merged weights
// (see lora.hpp for the design).
#include "redco/nn/lora.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "redco/core/error.hpp"

namespace redco::nn {

namespace {

constexpr std::string_view kA = ".lora_A", kB = ".lora_B", kWeight = ".weight";

// Hugging Face GPT-2 keeps q, k and v in one Conv1D (c_attn) and names its
// projections c_proj and c_fc; redco's GPT-2 splits and renames them.
std::vector<std::string> expand(const std::string& pattern) {
  if (pattern == "c_attn") return {"attn.q_proj", "attn.k_proj", "attn.v_proj"};
  if (pattern == "c_proj") return {"attn.o_proj", "mlp.fc2"};
  if (pattern == "attn.c_proj") return {"attn.o_proj"};
  if (pattern == "mlp.c_proj") return {"mlp.fc2"};
  if (pattern == "c_fc" || pattern == "mlp.c_fc") return {"mlp.fc1"};
  return {pattern};
}

std::vector<std::string> split_targets(const std::string& targets) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= targets.size()) {
    size_t end = targets.find(',', start);
    if (end == std::string::npos) end = targets.size();
    std::string t = targets.substr(start, end - start);
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    if (!t.empty()) out.push_back(std::move(t));
    start = end + 1;
  }
  REDCO_CHECK(!out.empty(), "lora: no target modules in '{}' (e.g. \"c_attn\", \"q_proj,v_proj\")",
              targets);
  return out;
}

// `module` is the pattern or ends with "." + pattern.
bool matches(std::string_view module, std::string_view pattern) {
  if (module == pattern) return true;
  return module.size() > pattern.size() && module.ends_with(pattern) &&
         module[module.size() - pattern.size() - 1] == '.';
}

// A fully-connected weight [out, in] whose split the adapters can follow.
bool adaptable(const ParamEntry& e) {
  return e.name.view().ends_with(kWeight) && e.shape.rank == 2 && e.role != Role::vocab &&
         e.role != Role::head_table;
}

// A and B for weight entry `w` of module `module`, roles from w's (lora.hpp).
std::pair<ParamEntry, ParamEntry> adapters_of(const ParamEntry& w, std::string_view module,
                                              int64_t r) {
  const int64_t out = w.shape.d[0], in = w.shape.d[1];
  ParamEntry a{Name(module), Role::replicated,           w.group, Dims{r, in},
               Init::normal, 1.f / std::sqrt(float(in)), 1};
  ParamEntry b{Name(module), Role::replicated, w.group, Dims{out, r}, Init::zeros, 0.f, 1};
  a.name.append(kA);
  b.name.append(kB);
  const int split = shard::split_dim_of(w.role);
  if (split == 0) b.role = w.role, b.unit = w.unit;  // rows of W and of B A: B's rows
  if (split == 1) a.role = w.role, a.unit = w.unit;  // columns of W and of B A: A's columns
  return {a, b};
}

}  // namespace

bool is_adapter(std::string_view name) {
  return name.ends_with(kA) || name.ends_with(kB) || name == kA.substr(1) || name == kB.substr(1);
}

void add_adapter_entries(std::vector<ParamEntry>& entries, size_t from, const LoraOptions& o) {
  REDCO_CHECK(o.rank >= 1, "lora: rank {} must be at least 1", o.rank);
  REDCO_CHECK(std::isfinite(o.alpha) && o.alpha != 0.f, "lora: alpha {} must be finite and nonzero",
              o.alpha);
  const std::vector<std::string> patterns = split_targets(o.targets);
  std::vector<ParamEntry> added;
  std::set<std::string> modules;  // every adaptable module, for the error message
  std::vector<int> hits(patterns.size(), 0);
  for (size_t i = from; i < entries.size(); ++i) {
    const ParamEntry& w = entries[i];
    if (!adaptable(w)) continue;
    const std::string_view module = w.name.view().substr(0, w.name.size() - kWeight.size());
    modules.emplace(module);
    bool hit = false;
    for (size_t p = 0; p < patterns.size(); ++p)
      for (const std::string& q : expand(patterns[p]))
        if (matches(module, q)) hits[p] += 1, hit = true;
    if (!hit) continue;
    REDCO_CHECK(o.rank <= std::min(w.shape.d[0], w.shape.d[1]),
                "lora: rank {} exceeds the sizes of {} [{}, {}]; choose a smaller rank", o.rank,
                w.name.view(), w.shape.d[0], w.shape.d[1]);
    auto [a, b] = adapters_of(w, module, o.rank);
    added.push_back(a), added.push_back(b);
  }
  for (size_t p = 0; p < patterns.size(); ++p) {
    if (hits[p]) continue;
    std::string some;
    for (const std::string& m : modules) {
      if (some.size() > 300) break;
      some += (some.empty() ? "" : ", ") + m;
    }
    throw Error(fmt::format(
        "lora: target '{}' matches no fully-connected weight of the model; targets name "
        "modules (or their last components) among: {}",
        patterns[p], some.empty() ? "(none)" : some));
  }
  entries.insert(entries.end(), added.begin(), added.end());
}

ParamTree with_merged_weights(const ParamTree& tree, std::string_view prefix, float scale,
                              const std::vector<ParamEntry>& entries, const Ctx& ctx) {
  const Name root(prefix);
  std::map<std::string_view, const ParamEntry*> by_name;
  for (const ParamEntry& e : entries) by_name.emplace(e.name.view(), &e);
  ParamTree out = tree;
  for (const ParamEntry& e : entries) {
    if (!e.name.view().ends_with(kA)) continue;
    const std::string_view module = e.name.view().substr(0, e.name.size() - kA.size());
    const ParamEntry& w = *by_name.at(std::string(module) + std::string(kWeight));
    const ParamEntry& eb = *by_name.at(std::string(module) + std::string(kB));
    const std::string name = std::string(root.dot(module).view());
    const auto find = [&](std::string_view leaf) -> const Tensor& {
      const auto it = tree.find(name + std::string(leaf));
      REDCO_CHECK(it != tree.end(),
                  "lora: no parameter {}{} (give the adapters: nn::with_adapters)", name, leaf);
      return it->second;
    };
    const Tensor &wt = find(kWeight), &a = find(kA), &b = find(kB);
    REDCO_CHECK(wt.dtype() == a.dtype() && b.dtype() == a.dtype(),
                "lora: {}.weight, lora_A and lora_B must have one dtype (convert the base to f32 "
                "before adding adapters)",
                name);
    const bool split = tp_active(ctx) && wt.shape() != w.shape.shape();
    const Tensor a_in = split && e.role == Role::replicated ? to_parallel(a, ctx) : a;
    const Tensor b_in = split && eb.role == Role::replicated ? to_parallel(b, ctx) : b;
    // [out, r] x [r, in]: on a shard, this rank's rows (column) or columns (row) of B A.
    out[name + std::string(kWeight)] = wt + matmul(b_in, a_in) * scale;
  }
  return out;
}

ParamTree drop_adapters(ParamTree merged) {
  for (auto it = merged.begin(); it != merged.end();)
    it = is_adapter(it->first) ? merged.erase(it) : std::next(it);
  return merged;
}

}  // namespace redco::nn
