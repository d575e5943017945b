#pragma once
// Every decoder-only family redco loads behind one layer type, for programs
// that take "any causal LM":
//
//   auto lm = models::from_pretrained<models::CausalLM>(dir);  // gpt2, llama, mistral,
//                                                              // qwen2, opt, gptj, gpt_neox
//   train::Trainer trainer(deployer, lm.model, collate, loss, opt, lm.params);
//   models::CausalLM fresh = models::causal_lm(models::Gpt2Config{.vocab = 2048});
//
// Why: a typed model (models::Gpt2, models::Llama, ...) compiles its forward
// and backward pass, and the Trainer, Predictor and generate around it, into
// every program that names it; a program taking five families compiled all
// of that five times (the language-modelling sample took GPT-2 and LLaMA only
// for that reason). A CausalLM's forward pass is compiled once per family, in
// the library (models/causal_lm.cpp), and reached through one virtual call per
// forward pass; the program compiles one Trainer.
//
// Nothing else changes: CausalLM adds no name (kName is empty, so the
// parameters are the family's own: "h.0.attn.q_proj.weight"), its walk is the
// family's walk (so shard::resolve, checkpoints, LoRA and ZeRO see the same
// parameters and plan) and its forward is the family's forward, bit for bit.
// What it cannot have is a compile-time plan (shard::plan_v): the family is a
// run-time value. Use the typed model for that.
#include <memory>
#include <string_view>

#include "redco/models/gpt2.hpp"
#include "redco/models/gpt_neox.hpp"
#include "redco/models/gptj.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/models/llama.hpp"
#include "redco/models/opt.hpp"

namespace redco::models {

class CausalLM {
 public:
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";  // the family's names, unprefixed

  // What one family provides (one implementation for all: causal_lm_family.hpp).
  struct Family {
    virtual ~Family() = default;
    virtual std::string_view name() const = 0;  // "gpt2", "llama" (Mistral, Qwen2 too), "opt", ...
    virtual int64_t vocab_size() const = 0;
    virtual int64_t max_positions() const = 0;  // longest sequence; 0: no table limits it
    virtual void walk(nn::Walker& w) const = 0;
    virtual Tensor forward(const nn::Params& p, const Tensor& x, nn::Ctx& ctx) const = 0;
    virtual hf::Layout layout() const = 0;                // where the checkpoint keeps each
    virtual io::Json hf_config(io::Json base) const = 0;  // config.json, base's other keys kept
  };

  explicit CausalLM(std::shared_ptr<const Family> family) : impl_(std::move(family)) {}

  std::string_view family() const { return impl_->name(); }
  int64_t vocab_size() const { return impl_->vocab_size(); }
  int64_t max_positions() const { return impl_->max_positions(); }
  hf::Layout layout() const { return impl_->layout(); }
  // Refuses, naming the fix, windows of `context` tokens longer than the
  // model's positions, or a tokenizer with ids past its vocabulary.
  void check_fits(int64_t context, int64_t tokenizer_ids) const;
  io::Json hf_config(io::Json base = io::Json::object()) const {
    return impl_->hf_config(std::move(base));
  }

  // Not constexpr: there is no model to walk at compile time (shard::plan_v).
  static void walk(nn::Walker& w, const CausalLM* m) {
    REDCO_CHECK(m, "models::CausalLM has no plan without a model: its family is a run-time value");
    m->impl_->walk(w);
  }
  // ids [B, T] (i64) -> logits [B, T, V] (or [B, 1, V] at ctx.logit_rows).
  Tensor forward(const nn::Params& p, const Tensor& x, nn::Ctx& ctx) const {
    return impl_->forward(p, x, ctx);
  }

 private:
  std::shared_ptr<const Family> impl_;
};

// A CausalLM of one family with these sizes (no parameters: nn::init_params
// or a Trainer given none draws them).
CausalLM causal_lm(const Gpt2Config& c);
CausalLM causal_lm(const LlamaConfig& c);  // LLaMA, Mistral, Qwen2
CausalLM causal_lm(const OptConfig& c);
CausalLM causal_lm(const GptjConfig& c);
CausalLM causal_lm(const GptNeoxConfig& c);
// The family config.json's model_type names; other model types are refused by name.
CausalLM causal_lm(const hf::Config& config);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
// Any decoder-only family, chosen by config.json's model_type (models/causal_lm.hpp):
// the model carries its family's config, so it is its own Config.
template <>
struct HfFamily<CausalLM> {
  using Config = CausalLM;
  static Config config(const hf::Config& f) { return causal_lm(f); }
  static CausalLM build(const Config& c) { return c; }
  static hf::Layout layout(const Config& c) { return c.layout(); }
  static io::Json to_json(const Config& c, io::Json base) { return c.hf_config(std::move(base)); }
};

}  // namespace redco::models
