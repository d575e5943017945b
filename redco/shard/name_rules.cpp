// Name-based tensor-parallel rules: see name_rules.hpp for the rules and why.
#include "redco/shard/name_rules.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "redco/core/error.hpp"

namespace redco::shard {
namespace {

using Parts = std::vector<std::string_view>;

struct Parsed {
  Parts mod;              // module path components (the name without its last component)
  std::string_view tail;  // last component: "weight", "bias", or a buffer's name
  std::string module;     // dotted module path
  std::string layer;      // prefix through the last all-digit component; empty outside layers
};

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Parsed parse(std::string_view name) {
  Parsed p;
  for (size_t start = 0;;) {
    const size_t dot = name.find('.', start);
    p.mod.push_back(name.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  p.tail = p.mod.back();
  p.mod.pop_back();
  p.module = std::string(name.substr(0, p.mod.empty() ? 0 : name.size() - p.tail.size() - 1));
  for (size_t i = p.mod.size(); i-- > 0;) {
    if (!all_digits(p.mod[i])) continue;
    p.layer = std::string(name.substr(0, size_t(p.mod[i].data() + p.mod[i].size() - name.data())));
    break;
  }
  return p;
}

bool has(std::string_view s, std::string_view sub) { return s.find(sub) != std::string_view::npos; }
bool one_of(std::string_view s, std::initializer_list<std::string_view> set) {
  return std::find(set.begin(), set.end(), s) != set.end();
}
bool attention_like(std::string_view c) {
  return has(c, "attention") || has(c, "Attention") || has(c, "attn");
}
// Whether a module (other than its last component) sits inside an attention block.
bool under_attention(const Parts& mod) {
  return std::any_of(mod.begin(), mod.end() - 1, attention_like);
}

bool column_side(Role r) {
  return r == Role::column || r == Role::attn_q || r == Role::attn_k || r == Role::attn_v;
}
bool row_side(Role r) { return r == Role::row || r == Role::attn_o; }
bool is_attention(Role r) { return column_side(r) ? r != Role::column : r == Role::attn_o; }

struct Match {
  Role role;
  int fused = 1;        // packed q|k|v blocks along the output dim
  bool conv1d = false;  // a GPT-2 Conv1D, stored (in, out)
};

// GPT-2's Conv1D modules; c_proj is the attention O inside attn/crossattention.
std::optional<Match> match_gpt2(std::string_view leaf, const Parts& mod) {
  if (leaf == "c_attn") {  // self-attention packs q|k|v; cross-attention packs k|v
    const bool cross = mod.size() > 1 && mod[mod.size() - 2] == "crossattention";
    return Match{cross ? Role::attn_k : Role::attn_q, cross ? 2 : 3, true};
  }
  if (leaf == "q_attn") return Match{Role::attn_q, 1, true};
  if (leaf == "c_proj") return Match{under_attention(mod) ? Role::attn_o : Role::row, 1, true};
  if (leaf == "c_fc") return Match{Role::column, 1, true};
  return std::nullopt;
}

std::optional<Match> match_attention(std::string_view leaf, const Parts& mod) {
  if (one_of(leaf, {"q_proj", "q_lin"})) return Match{Role::attn_q};
  if (one_of(leaf, {"k_proj", "k_lin"})) return Match{Role::attn_k};
  if (one_of(leaf, {"v_proj", "v_lin"})) return Match{Role::attn_v};
  if (one_of(leaf, {"o_proj", "out_proj", "out_lin"})) return Match{Role::attn_o};
  if (!under_attention(mod)) return std::nullopt;
  // T5's SelfAttention.q, BERT's attention.self.query, Meta LLaMA's attention.wq.
  if (one_of(leaf, {"q", "query", "wq"})) return Match{Role::attn_q};
  if (one_of(leaf, {"k", "key", "wk"})) return Match{Role::attn_k};
  if (one_of(leaf, {"v", "value", "wv"})) return Match{Role::attn_v};
  if (one_of(leaf, {"o", "wo"})) return Match{Role::attn_o};
  if (leaf == "dense" && mod[mod.size() - 2] == "output") return Match{Role::attn_o};  // BERT
  return std::nullopt;
}

std::optional<Match> match_mlp(std::string_view leaf, const Parts& mod) {
  const std::string_view parent = mod.size() > 1 ? mod[mod.size() - 2] : "";
  if (one_of(leaf, {"up_proj", "gate_proj", "fc1", "fc_in", "wi", "wi_0", "wi_1", "w1", "w3"}))
    return Match{Role::column};
  if (leaf == "dense" && parent == "intermediate") return Match{Role::column};  // BERT
  if (one_of(leaf, {"down_proj", "fc2", "fc_out", "wo", "w2"})) return Match{Role::row};
  // BERT's layer-level output.dense; attention.output.dense was taken as O above.
  if (leaf == "dense" && parent == "output") return Match{Role::row};
  return std::nullopt;
}

// The role a module's name gives its parameters, or nullopt if no pattern knows it.
std::optional<Match> classify(const Parts& mod) {
  if (mod.empty()) return std::nullopt;
  const std::string_view leaf = mod.back();
  if (has(leaf, "norm") || has(leaf, "Norm") || leaf.starts_with("ln_") || leaf == "ln")
    return Match{Role::replicated};
  if (one_of(leaf, {"wpe", "embed_positions", "position_embeddings", "token_type_embeddings",
                    "relative_attention_bias"}))
    return Match{Role::replicated};
  if (one_of(leaf,
             {"embed_tokens", "wte", "word_embeddings", "shared", "lm_head", "tok_embeddings"}))
    return Match{Role::vocab};
  if (leaf == "output" && mod.size() == 1) return Match{Role::vocab};  // Meta LLaMA's head
  if (auto m = match_gpt2(leaf, mod)) return m;
  if (auto m = match_attention(leaf, mod)) return m;
  return match_mlp(leaf, mod);
}

std::string fused_note(const std::string& name, int n, int blocks) {
  return fmt::format("{}: fused, each shard takes its 1/{} of each of the {} blocks", name, n,
                     blocks);
}

struct Group {
  std::string layer;
  std::vector<int> members;
};

class Planner {
 public:
  Planner(std::span<const NamedShape> params, int n, const NameRuleOptions& opts)
      : params_(params), n_(n), opts_(opts) {}

  std::vector<ParamSplit> run() {
    assign_roles();
    resolve_head_dim();
    for (size_t i = 0; i < out_.size(); ++i)
      if (out_[i].role == Role::vocab) split_vocab(int(i));
    for (const Group& g : groups_) resolve(g);
    follow_biases();
    return std::move(out_);
  }

 private:
  // Semantic (out, in) dim -> stored dim.
  static int stored(const ParamSplit& p, int dim) { return p.in_out ? 1 - dim : dim; }

  void assign_roles();
  void assign_weight(int i, const std::optional<Match>& m);
  void add_to_group(int i, const std::string& key, const std::string& layer);
  void resolve_head_dim();
  void split_vocab(int i);
  std::string blocker(int i, std::string& caveat) const;
  void resolve(const Group& g);
  void follow_biases();

  std::span<const NamedShape> params_;
  int n_;
  NameRuleOptions opts_;
  int64_t head_dim_ = 0;
  std::vector<ParamSplit> out_;
  std::vector<Parsed> parsed_;
  std::vector<Group> groups_;
  std::unordered_map<std::string, int> group_of_;
  std::unordered_map<std::string, int> weight_of_module_;
  // Unrecognised linears per layer: how many column-then-row runs, and whether one is open.
  std::unordered_map<std::string, std::pair<int, bool>> alternation_;
};

void Planner::assign_roles() {
  std::unordered_set<std::string_view> seen;
  for (const NamedShape& p : params_) {
    REDCO_CHECK(seen.insert(p.name).second, "parameter '{}' is listed twice", p.name);
    out_.push_back({p.name, p.shape, Role::replicated, -1, {}, false, 1});
    parsed_.push_back(parse(p.name));
    if (parsed_.back().tail == "weight")
      weight_of_module_[parsed_.back().module] = int(out_.size()) - 1;
  }
  for (size_t i = 0; i < out_.size(); ++i) {
    const Parsed& p = parsed_[i];
    // Biases are decided by their weight (follow_biases); other buffers stay whole.
    if (p.tail == "weight") assign_weight(int(i), classify(p.mod));
  }
}

void Planner::assign_weight(int i, const std::optional<Match>& m) {
  ParamSplit& s = out_[size_t(i)];
  const Parsed& p = parsed_[size_t(i)];
  const bool linear_2d = s.shape.rank() == 2;
  if (m) {
    s.role = m->role;
    if (m->role == Role::replicated || m->role == Role::vocab) return;
    if (!linear_2d) {
      s.note = fmt::format("{} {}: a {} weight must be 2-D; replicated", s.name, s.shape,
                           role_name(s.role));
      return;
    }
    s.in_out = opts_.conv1d == Conv1d::always || (opts_.conv1d == Conv1d::detect && m->conv1d);
    s.fused_blocks = m->fused;
    add_to_group(i, p.layer + (is_attention(s.role) ? "|attention" : "|mlp"), p.layer);
    return;
  }
  if (!linear_2d) return;
  const bool embedding = !p.mod.empty() && (has(p.mod.back(), "emb") || has(p.mod.back(), "Emb"));
  if (p.layer.empty() || embedding) {
    s.note = fmt::format("{} {}: {}; replicated", s.name, s.shape,
                         embedding ? "an embedding no rule covers"
                                   : "a linear outside any numbered layer has no order to "
                                     "alternate by");
    return;
  }
  // Rule 1 by position: unrecognised linears of a layer alternate in the given order.
  auto& [runs, open] = alternation_[p.layer];
  if (!open) ++runs;
  s.role = open ? Role::row : Role::column;
  s.in_out = opts_.conv1d == Conv1d::always;
  open = !open;
  add_to_group(i, fmt::format("{}|alternation {}", p.layer, runs), p.layer);
}

void Planner::add_to_group(int i, const std::string& key, const std::string& layer) {
  auto [it, fresh] = group_of_.try_emplace(key, int(groups_.size()));
  if (fresh) groups_.push_back({layer, {}});
  groups_[size_t(it->second)].members.push_back(i);
}

void Planner::resolve_head_dim() {
  REDCO_CHECK(opts_.head_dim >= 0 && opts_.num_heads >= 0,
              "head_dim ({}) and num_heads ({}) must not be negative", opts_.head_dim,
              opts_.num_heads);
  head_dim_ = opts_.head_dim;
  if (head_dim_ > 0 || opts_.num_heads == 0) return;
  for (const ParamSplit& s : out_) {
    if (s.role != Role::attn_q || s.shape.rank() != 2) continue;
    const int64_t width = s.shape[stored(s, 0)] / s.fused_blocks;
    REDCO_CHECK(width % opts_.num_heads == 0,
                "num_heads {} does not divide the query width {} of {} {}", opts_.num_heads, width,
                s.name, s.shape);
    head_dim_ = width / opts_.num_heads;
    return;
  }
}

void Planner::split_vocab(int i) {
  ParamSplit& s = out_[size_t(i)];
  if (s.shape.rank() != 2) {
    s.note = fmt::format("{} {}: a vocabulary table must be 2-D; replicated", s.name, s.shape);
  } else if (s.shape[0] % n_ != 0) {
    s.note = fmt::format("{} {}: vocabulary of {} does not divide into {} shards; replicated",
                         s.name, s.shape, s.shape[0], n_);
  } else {
    s.split_dim = 0;
  }
}

// Empty if weight i can split n ways (whole heads for attention); otherwise why not.
// `caveat` is set when the split can't be checked for whole heads.
std::string Planner::blocker(int i, std::string& caveat) const {
  const ParamSplit& s = out_[size_t(i)];
  const int dim = stored(s, split_dim_of(s.role));
  const int64_t size = s.shape[dim];
  if (size % s.fused_blocks != 0)
    return fmt::format("{} {}: dim {} of size {} does not hold {} equal fused blocks", s.name,
                       s.shape, dim, size, s.fused_blocks);
  const int64_t block = size / s.fused_blocks;
  const std::string what =
      s.fused_blocks > 1 ? fmt::format("each of its {} fused blocks of {}", s.fused_blocks, block)
                         : fmt::format("dim {} of size {}", dim, size);
  const bool heads = is_attention(s.role);
  if (heads && head_dim_ > 0) {
    if (block % (int64_t(n_) * head_dim_) != 0)
      return fmt::format("{} {}: {} is not {} shards x whole heads of {}", s.name, s.shape, what,
                         n_, head_dim_);
    return {};
  }
  if (block % n_ != 0)
    return fmt::format("{} {}: {} does not divide into {} shards", s.name, s.shape, what, n_);
  if (heads && n_ > 1)
    caveat = fmt::format(
        "head size unknown: each shard holds whole heads only if the head count divides by {}", n_);
  return {};
}

// A group splits only as a whole, so split activations always have a producer and a consumer.
void Planner::resolve(const Group& g) {
  const auto any = [&](bool (*side)(Role)) {
    return std::any_of(g.members.begin(), g.members.end(),
                       [&](int i) { return side(out_[size_t(i)].role); });
  };
  std::string why;
  if (!any(row_side))
    why = fmt::format("no row-parallel partner consumes its split outputs in layer '{}'", g.layer);
  else if (!any(column_side))
    why =
        fmt::format("no column-parallel partner produces its split inputs in layer '{}'", g.layer);
  std::vector<std::string> caveats(g.members.size()), blockers(g.members.size());
  for (size_t k = 0; k < g.members.size(); ++k) {
    blockers[k] = blocker(g.members[k], caveats[k]);
    if (why.empty() && !blockers[k].empty()) why = "its group cannot split: " + blockers[k];
  }
  for (size_t k = 0; k < g.members.size(); ++k) {
    ParamSplit& s = out_[size_t(g.members[k])];
    if (!why.empty()) {
      s.note = blockers[k].empty() ? fmt::format("{}: {}; replicated", s.name, why)
                                   : blockers[k] + "; replicated";
      continue;
    }
    s.split_dim = stored(s, split_dim_of(s.role));
    s.note = s.fused_blocks > 1 ? fused_note(s.name, n_, s.fused_blocks) : std::string();
    if (!caveats[k].empty()) s.note += (s.note.empty() ? s.name + ": " : "; ") + caveats[k];
  }
}

void Planner::follow_biases() {
  for (size_t i = 0; i < out_.size(); ++i) {
    if (parsed_[i].tail != "bias") continue;
    const auto it = weight_of_module_.find(parsed_[i].module);
    if (it == weight_of_module_.end()) continue;
    const ParamSplit& w = out_[size_t(it->second)];
    ParamSplit& b = out_[i];
    if (row_side(w.role)) b.role = Role::row_bias;  // added once, after the all-reduce
    if (!column_side(w.role) && w.role != Role::vocab) continue;
    b.role = Role::column_bias;
    b.fused_blocks = w.fused_blocks;
    const int64_t outs = w.shape.rank() == 2 ? w.shape[stored(w, 0)] : -1;
    if (w.split_dim < 0) {
      b.note = fmt::format("{}: follows its weight {}, which is replicated", b.name, w.name);
    } else if (b.shape.rank() != 1 || b.shape[0] != outs) {
      b.note = fmt::format("{} {}: does not match the {} outputs of {}; replicated", b.name,
                           b.shape, outs, w.name);
    } else {
      b.split_dim = 0;
      if (w.fused_blocks > 1) b.note = fused_note(b.name, n_, w.fused_blocks);
    }
  }
}

}  // namespace

std::vector<ParamSplit> plan_by_names(std::span<const NamedShape> params, int n_shards,
                                      const NameRuleOptions& opts) {
  REDCO_CHECK(n_shards >= 1, "a shard plan needs at least one shard, got {}", n_shards);
  return Planner(params, n_shards, opts).run();
}

Shape shard_shape(const ParamSplit& p, int n_shards) {
  REDCO_CHECK(n_shards >= 1, "a shard plan needs at least one shard, got {}", n_shards);
  if (p.split_dim < 0) return p.shape;
  return p.shape.with(p.split_dim, p.shape[p.split_dim] / n_shards);
}

std::vector<IndexRange> shard_ranges(const ParamSplit& p, int n_shards, int shard) {
  REDCO_CHECK(shard >= 0 && shard < n_shards, "shard {} is out of range for {} shards", shard,
              n_shards);
  if (p.split_dim < 0) return {};
  const int64_t block = p.shape[p.split_dim] / p.fused_blocks;
  const int64_t per = block / n_shards;
  std::vector<IndexRange> ranges;
  for (int b = 0; b < p.fused_blocks; ++b)
    ranges.push_back({b * block + shard * per, b * block + (shard + 1) * per});
  return ranges;
}

std::string describe(const std::vector<ParamSplit>& plan, int n_shards) {
  std::vector<std::array<std::string, 5>> rows{
      {"parameter", "shape", "role", "split", "bytes/shard (f32)"}};
  int64_t whole = 0, per_shard = 0;
  for (const ParamSplit& p : plan) {
    const int64_t bytes = shard_shape(p, n_shards).numel() * 4;
    whole += p.shape.numel() * 4;
    per_shard += bytes;
    std::string split = "-";
    if (p.split_dim >= 0)
      split = p.fused_blocks > 1 ? fmt::format("dim {} ({} blocks)", p.split_dim, p.fused_blocks)
                                 : fmt::format("dim {}", p.split_dim);
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
