#pragma once
// The one traversal every model goes through. A `Walker` visits a model's
// type (at compile time, with no object: the shard plan) or a model object
// (at run time: parameter names, shapes and initialisers), in execution
// order. `Params` replays the same naming during the forward pass.
//
// Naming. A node is either *transparent* (sequence, residual, parallel sum:
// it adds no path component) or *named* (a layer with parameters, `named`,
// `repeat`). Named nodes reached through transparent ones share one scope;
// each gets its base name ("ln", "attn", "mlp", ...), and base names that
// occur more than once in a scope are numbered from 1: a GPT-2 block
// `residual(ln | attn) | residual(ln | mlp)` names ln_1, attn, ln_2, mlp.
// `repeat` numbers its copies: h.0, h.1, ... (h.* in compile-time plans).
#include <array>
#include <concepts>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "redco/core/param_tree.hpp"
#include "redco/core/tensor.hpp"
#include "redco/nn/name.hpp"
#include "redco/shard/spec.hpp"

namespace redco::comm {
class Comm;
}
namespace redco::nn {
class KVCache;
}

namespace redco::nn {

using shard::Role;

// ---- node traits ----------------------------------------------------------------
template <typename L>
concept Transparent = L::kTransparent;
template <typename L>
concept NamedNode = !L::kTransparent && !L::kName.empty();

// Appends the base names of the named nodes in one scope, in order.
struct NameCollector {
  std::vector<std::string_view> names;
  constexpr void add(std::string_view n) { names.push_back(n); }
};
template <typename L>
constexpr void collect_names(NameCollector& c) {
  if constexpr (Transparent<L>)
    L::template for_each_child_type([&]<typename C>() { collect_names<C>(c); });
  else if constexpr (NamedNode<L>)
    c.add(L::kName);
}

// The final names of the named nodes directly in the scope of transparent
// node L (base names, numbered where they repeat).
template <typename L>
constexpr size_t scope_size() {
  NameCollector c;
  collect_names<L>(c);
  return c.names.size();
}
template <typename L>
constexpr std::array<Name, scope_size<L>()> make_scope_names() {
  NameCollector c;
  collect_names<L>(c);
  std::array<Name, scope_size<L>()> out{};
  for (size_t i = 0; i < c.names.size(); ++i) {
    size_t total = 0, before = 0;
    for (size_t j = 0; j < c.names.size(); ++j) {
      total += c.names[j] == c.names[i];
      before += j < i && c.names[j] == c.names[i];
    }
    out[i] = Name(c.names[i]);
    if (total > 1) {
      out[i].append("_");
      out[i].append_index((long long)(before + 1));
    }
  }
  return out;
}
template <typename L>
inline constexpr auto scope_names_v = make_scope_names<L>();

// ---- what a walk records ---------------------------------------------------------
struct Dims {  // run-time sizes of a parameter (empty at compile time)
  std::array<int64_t, 4> d{};
  int rank = 0;
  constexpr Dims() = default;
  constexpr Dims(std::initializer_list<int64_t> l) {
    for (int64_t v : l) d[size_t(rank++)] = v;
  }
  Shape shape() const { return Shape(std::span<const int64_t>(d.data(), size_t(rank))); }
};

enum class Init : uint8_t { normal, zeros, ones };

struct ParamEntry {
  Name name;
  Role role = Role::replicated;
  int group = -1;  // parameters split together (a column/row pair, an attention block)
  Dims shape;
  Init init = Init::zeros;
  float init_std = 0.f;
  int64_t unit = 1;  // the split must keep blocks of this size whole (an attention head)
};

enum class Collective : uint8_t {
  enter_parallel,  // before a column-parallel block: identity forward, all-reduce backward
  all_reduce,      // after a row-parallel layer or a vocab-split embedding: forward all-reduce
  all_gather,      // sharded features needed whole (a norm, a residual add): gather them
  vocab_logits,    // logits stay split by vocabulary; the loss reduces max and sum-exp
};

struct CollectiveEntry {
  Name where;  // the layer after (or before) which it happens
  Collective kind;
};

// ---- the walker ------------------------------------------------------------------
class Walker {
 public:
  std::vector<ParamEntry> params;
  std::vector<CollectiveEntry> collectives;

  // Layers call these to declare parameters (leaf = "weight", "q_proj.weight", ...).
  constexpr void param(std::string_view leaf, Role role, Dims shape, Init init, float std = 0.f,
                       int64_t unit = 1) {
    params.push_back({path_.dot(leaf), role, group_, shape, init, std, unit});
  }
  // The rules' state: are the activations split across shards by feature?
  constexpr bool sharded() const { return sharded_; }
  // A layer that needs whole features (norm, residual add, attention input).
  constexpr void need_whole(std::string_view what = {}) {
    if (!sharded_) return;
    collectives.push_back({path_.dot(what), Collective::all_gather});
    sharded_ = false;
  }
  // Rule 1: fully-connected layers alternate column, row, column, ...
  constexpr Role next_linear_role() {
    if (!sharded_) {
      group_ = next_group_++;
      collectives.push_back({path_, Collective::enter_parallel});
      sharded_ = true;
      return Role::column;
    }
    collectives.push_back({path_, Collective::all_reduce});
    sharded_ = false;
    return Role::row;
  }
  // Rule 2 and other self-contained parallel blocks (attention, gated MLP):
  // enter with whole features, leave with one all-reduce.
  constexpr void begin_block() {
    need_whole();
    group_ = next_group_++;
    collectives.push_back({path_, Collective::enter_parallel});
  }
  constexpr void end_block() { collectives.push_back({path_, Collective::all_reduce}); }
  constexpr void new_group() { group_ = next_group_++; }
  constexpr void add_collective(Collective kind) { collectives.push_back({path_, kind}); }
  constexpr const Name& path() const { return path_; }

  // Visits a child of a transparent node (C is the child's type).
  template <typename C>
  constexpr void child(const C* obj) {
    if constexpr (!NamedNode<C>) {
      C::walk(*this, obj);
    } else {
      const Name saved = path_;
      path_ = path_.dot(next_scope_name().view());
      C::walk(*this, obj);
      path_ = saved;
    }
  }
  // Visits what a named node holds, under the current path.
  template <typename L>
  constexpr void content(const L* obj) {
    if constexpr (Transparent<L>) {
      const Name* saved = scope_;
      const size_t saved_pos = pos_, saved_size = scope_size_;
      scope_ = scope_names_v<L>.data();
      scope_size_ = scope_names_v<L>.size();
      pos_ = 0;
      L::walk(*this, obj);
      scope_ = saved, pos_ = saved_pos, scope_size_ = saved_size;
    } else {
      L::walk(*this, obj);
    }
  }
  // Path component for a repeat's copy: an index at run time, "*" in plans.
  template <typename F>
  constexpr void indexed(long long i, F&& body) {
    const Name saved = path_;
    if (i < 0) {
      path_ = path_.dot("*");
    } else {
      Name idx;
      idx.append_index(i);
      path_ = path_.dot(idx.view());
    }
    body();
    path_ = saved;
  }

 private:
  constexpr Name next_scope_name() {
    if (pos_ >= scope_size_) throw "redco::nn: scope naming out of step with the model";
    return scope_[pos_++];
  }
  Name path_;
  const Name* scope_ = nullptr;
  size_t pos_ = 0, scope_size_ = 0;
  bool sharded_ = false;
  int group_ = -1, next_group_ = 0;
};

// ---- the forward pass's view of parameters ----------------------------------------
// What a linear or conv2d layer records when Ctx::taps is set, for per-example
// gradient norms and clipped sums (redco/privacy/clipped_grads.hpp): the
// layer's input and output, from which its weight gradient per example follows.
struct LayerTap {
  std::string weight, bias;                 // parameter names (bias empty: the layer has none)
  Tensor input;                             // linear [B(, T), in]; conv2d [N, C, H, W]
  Tensor output;                            // linear [B(, T), out]; conv2d [N, O, OH, OW]
  int64_t kernel = 0, stride = 1, pad = 0;  // conv2d's; kernel 0: a linear layer
};
using LayerTaps = std::vector<LayerTap>;

struct Ctx {
  bool train = false;  // dropout on
  uint64_t seed = 0;   // dropout masks depend on (seed, step, call index) only
  uint64_t step = 0;
  uint64_t dropout_calls = 0;
  int64_t layer = 0;  // the copy of the innermost nn::repeat being run (set by Repeat)
  // Training: every copy of an nn::repeat runs as nn::checkpoint(copy) (only
  // its input kept for backward, the copy run again there).
  bool recompute = false;
  Tensor source{};  // encoder input (token ids), for encoder-decoder models
  Tensor memory{};  // encoder output, for cross-attention
  // Padded batches (Hugging Face's attention_mask): [B, T], 1 for a token, 0
  // for padding, each row one run of ones (left or right padding). `mask`
  // belongs to the input being run, `source_mask` to ctx.source (and then to
  // ctx.memory's keys). Undefined: no padding.
  Tensor mask{};
  Tensor source_mask{};
  Tensor memory_mask{};  // set by encoder_decoder from source_mask
  // An additive bias on self-attention scores, [heads here, Tq, Tk] (T5's
  // relative position bias): set by nn::RelativePositionBias before a stack
  // of layers, read by every Attention with score_bias on.
  Tensor score_bias{};
  // BERT's token_type_ids [B, T] (i64) for nn::TokenTypeEmbedding; undefined: all 0.
  Tensor token_types{};
  // Diffusion timesteps [B] (f32) for a UNet's timestep embedding (models/unet.hpp).
  Tensor timesteps{};
  // Generation (nn/kv_cache.hpp): attention reads and extends the cache, and
  // positions continue each row's own. logit_rows (i64 [B]): the one input
  // position per row whose logits the LM head computes ([B, 1, V]).
  KVCache* cache = nullptr;
  Tensor logit_rows{};
  // The model-parallel group this rank computes with (nullptr or size 1: the
  // whole model here). Parameters are then this rank's shards (see
  // train::shard_params), and each layer reads from the plan (Params::split)
  // whether it is split, adding the collectives the plan puts there.
  comm::Comm* mp = nullptr;
  // Whether the current activation is split by features (its last dim) across
  // mp, as Walker::sharded() says at plan time; layers that need whole
  // features gather first. nn::apply resets it.
  bool split_features = false;
  // Whether a model output left split by its last dim (vocabulary-split
  // logits) is returned split, carrying a placement that cross_entropy reads
  // without gathering, or gathered whole. By default it stays split in
  // training, and evaluation and prediction get whole outputs (argmax works).
  enum class SplitOutput : uint8_t { in_training, always, never };
  SplitOutput split_output = SplitOutput::in_training;
  // Per-example clipping: linear and conv2d layers append what they computed
  // (whole layers only: n_model_shards = 1).
  LayerTaps* taps = nullptr;
};

using redco::ParamTree;  // core/param_tree.hpp; nn::ParamTree names the same type

// The plan's decision for every parameter of a model run with tensor
// parallelism: its name (relative to the model) -> the dimension cut across
// the model shards, -1 when every shard holds it whole. Made once from
// shard::resolve (nn::split_table); layers read it through Params::split and
// never guess it from a shape.
using SplitTable = std::map<std::string, int, std::less<>>;

class Params {
 public:
  // `splits`: the model's plan when it runs split across model shards
  // (null: every parameter is whole here). Shared, because a recomputed block
  // replays its view during backward, after the forward call returned.
  explicit Params(const ParamTree& tree, std::shared_ptr<const SplitTable> splits = {})
      : tree_(&tree), splits_(std::move(splits)) {}
  // A model whose parameters sit under `root` in `tree` (a part of
  // nn::parts: "actor.0.weight"); at_root names resolve under it too.
  Params(const ParamTree& tree, const Name& root, std::shared_ptr<const SplitTable> splits = {})
      : tree_(&tree), splits_(std::move(splits)), path_(root), root_(root) {}
  // By value: a parameter the tree lacks may be made for this read (ZeRO-3
  // gathers it, nn::ParamReadHook::provide) and lives as long as its users.
  Tensor operator[](std::string_view leaf) const;
  Tensor at_root(std::string_view name) const;  // e.g. a tied embedding
  // The shape of parameter `leaf` without reading its values (a read waits
  // for them, or under ZeRO-3 gathers them).
  Shape shape(std::string_view leaf) const;
  // The dimension of parameter `leaf` (or of the root name `name`) that the
  // plan cuts across the model shards; -1: whole here.
  int split(std::string_view leaf) const;
  int split_at_root(std::string_view name) const;
  const Name& path() const { return path_; }
  const ParamTree& tree() const { return *tree_; }
  // This view over `tree` (same path), naming the next layers from where this
  // one stands with a counter of its own: a recomputed block replays its names.
  Params rebound(const ParamTree& tree) const {
    Params p = *this;
    p.tree_ = &tree;
    p.pos_ = std::make_shared<size_t>(*pos_);
    return p;
  }

  // This view reading `tree` instead, naming on with the same counter (a
  // layer that substitutes some parameters: nn::Lora's merged weights).
  Params with_tree(const ParamTree& tree) const {
    Params p = *this;
    p.tree_ = &tree;
    return p;
  }

  // Mirrors Walker::child / content / indexed.
  template <typename C, typename F>
  auto child(F&& body) const {
    if constexpr (!NamedNode<C>) {
      return body(*this);
    } else {
      Params sub = *this;
      sub.path_ = path_.dot(next_scope_name().view());
      return body(sub);
    }
  }
  template <typename L>
  Params content() const {
    Params p = *this;
    if constexpr (Transparent<L>) {
      p.scope_ = scope_names_v<L>.data();
      p.scope_size_ = scope_names_v<L>.size();
      p.pos_ = std::make_shared<size_t>(0);
    }
    return p;
  }
  Params indexed(long long i) const {
    Params p = *this;
    Name idx;
    idx.append_index(i);
    p.path_ = path_.dot(idx.view());
    return p;
  }

 private:
  Name next_scope_name() const;
  Tensor lookup(std::string_view full_name) const;
  int split_of(std::string_view model_name) const;
  const ParamTree* tree_;
  std::shared_ptr<const SplitTable> splits_;
  Name path_;
  Name root_;  // empty: the model is the whole tree
  const Name* scope_ = nullptr;
  size_t scope_size_ = 0;
  std::shared_ptr<size_t> pos_ = std::make_shared<size_t>(0);
};

}  // namespace redco::nn
