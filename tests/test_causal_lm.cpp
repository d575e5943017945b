// models::CausalLM, every decoder-only family behind one type, against the
// typed models it wraps: on every causal fixture of tests/fixtures/hf (tiny
// checkpoints saved by the real transformers) the same parameters and plan,
// the same logits (bit for bit, and within 1e-4 of transformers'), the same
// gradients with and without recomputation, the same tokens from generate,
// the same logits on 2 model shards, the same Trainer losses, and a saved
// folder that the typed loader reads back bit for bit.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "hf_fixtures.hpp"
#include "lm_windows.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/core/philox.hpp"
#include "redco/generation/generate.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

// Every decoder-only fixture, with the family CausalLM reports for it.
const std::vector<std::pair<std::string, std::string>> kFixtures = {
    {"gpt2", "gpt2"},
    {"gpt2_variants", "gpt2"},
    {"llama", "llama"},
    {"llama_head_dim", "llama"},
    {"llama3_tied", "llama"},
    {"mistral", "llama"},
    {"qwen2", "llama"},
    {"opt", "opt"},
    {"opt_post_ln_proj", "opt"},
    {"gptj", "gptj"},
    {"gptj_full_rotary_tied", "gptj"},
    {"gpt_neox", "gpt_neox"},
    {"gpt_neox_sequential", "gpt_neox"}};

// f.template operator()<M>() for the typed model of a causal fixture.
template <typename F>
auto with_typed(const fs::path& dir, F&& f) {
  using namespace models;
  return with_family<Gpt2, Llama, Opt, Gptj, GptNeox>(dir, std::forward<F>(f));
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && test::max_abs_diff(a, b) == 0.f;
}

// Next-token loss over ids [B, T]: inputs are the first T - 1, targets the last.
template <typename M>
Tensor next_token_loss(const M& model, const nn::ParamTree& p, const Tensor& ids, nn::Ctx ctx) {
  const int64_t T = ids.dim(1) - 1;
  ctx.train = true;
  const Tensor in = slice(ids, 1, 0, T).clone(), out = slice(ids, 1, 1, T + 1).clone();
  return cross_entropy(nn::apply(model, p, in, ctx), out);
}

}  // namespace

TEST_CASE("CausalLM is each family's model: parameters, logits and gradients bit for bit",
          "[causal_lm]") {
  for (const auto& [name, family] : kFixtures) {
    INFO("fixture " << name);
    const fs::path dir = test::hf_fixture(name);
    const nn::ParamTree g = io::load_safetensors(dir / "golden.safetensors");
    const Tensor ids = g.at("input_ids");
    const auto lm = models::from_pretrained<models::CausalLM>(dir);
    CHECK(lm.model.family() == family);
    NoGradGuard off;
    const Tensor logits = nn::apply(lm.model, lm.params, ids);
    CHECK(test::max_abs_diff(logits, g.at("logits")) <= 1e-4f);  // transformers'
    with_typed(dir, [&]<typename M>() {
      const auto typed = models::from_pretrained<M>(dir);
      const auto want = nn::param_entries(typed.model), got = nn::param_entries(lm.model);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].name.view() == want[i].name.view());
        CHECK(got[i].shape.shape() == want[i].shape.shape());
        CHECK(got[i].role == want[i].role);
      }
      CHECK(same(logits, nn::apply(typed.model, typed.params, ids)));
      if (g.count("attention_mask")) {  // a padded batch
        nn::Ctx a, b;
        a.mask = b.mask = g.at("attention_mask");
        CHECK(same(nn::apply(lm.model, lm.params, ids, a),
                   nn::apply(typed.model, typed.params, ids, b)));
      }
      GradModeGuard on(true);
      for (bool recompute : {false, true}) {
        INFO("recompute " << recompute);
        nn::Ctx ctx;
        ctx.recompute = recompute;
        auto [l1, g1] = value_and_grad(
            [&](const nn::ParamTree& p) { return next_token_loss(lm.model, p, ids, ctx); },
            lm.params);
        auto [l2, g2] = value_and_grad(
            [&](const nn::ParamTree& p) { return next_token_loss(typed.model, p, ids, ctx); },
            typed.params);
        CHECK(l1.item() == l2.item());
        REQUIRE(g1.size() == g2.size());
        for (const auto& [k, t] : g2) {
          INFO(k);
          CHECK(same(g1.at(k), t));
        }
      }
      return 0;
    });
  }
}

TEST_CASE("CausalLM on 2 model shards gives the typed model's sharded logits", "[causal_lm][tp]") {
  for (const char* name : {"gpt2", "llama", "opt", "gptj", "gpt_neox"}) {
    INFO("fixture " << name);
    const fs::path dir = test::hf_fixture(name);
    const Tensor ids = io::load_safetensors(dir / "golden.safetensors").at("input_ids");
    with_typed(dir, [&]<typename M>() {
      std::vector<Tensor> got(2), want(2);
      comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
        const models::hf::LoadOptions part{.n_shards = 2, .rank = comm.rank()};
        const auto lm = models::from_pretrained<models::CausalLM>(dir, part);
        const auto typed = models::from_pretrained<M>(dir, part);
        NoGradGuard off;
        nn::Ctx a, b;
        a.mp = b.mp = &comm;
        got[size_t(comm.rank())] = nn::apply(lm.model, lm.params, ids, a);
        want[size_t(comm.rank())] = nn::apply(typed.model, typed.params, ids, b);
      });
      CHECK(same(got[0], want[0]));
      CHECK(same(got[1], want[1]));
      return 0;
    });
  }
}

TEST_CASE("CausalLM generates the typed model's tokens, greedy and sampled", "[causal_lm]") {
  const std::vector<std::vector<int64_t>> prompts{{5, 17, 42}, {9}};
  for (const char* name : {"gpt2", "qwen2", "opt", "gptj", "gpt_neox_sequential"}) {
    INFO("fixture " << name);
    const fs::path dir = test::hf_fixture(name);
    const auto lm = models::from_pretrained<models::CausalLM>(dir);
    with_typed(dir, [&]<typename M>() {
      const auto typed = models::from_pretrained<M>(dir);
      for (bool sample : {false, true}) {
        const generation::GenerationConfig how{
            .max_new_tokens = 8, .do_sample = sample, .top_p = 0.9f, .seed = 7};
        CHECK(generation::generate(lm.model, lm.params, prompts, how).sequences ==
              generation::generate(typed.model, typed.params, prompts, how).sequences);
      }
      return 0;
    });
  }
}

TEST_CASE("a Trainer of a CausalLM takes the typed Trainer's steps and exports its folder",
          "[causal_lm]") {
  std::vector<test::Window> train;
  for (uint64_t i = 0; i < 32; ++i) {  // a learnable pattern: t -> t + 5 (mod 96)
    test::Window w{{int64_t(philox_bits(9, 0, i) % 96)}};
    while (w.ids.size() < 17) w.ids.push_back((w.ids.back() + 5) % 96);
    train.push_back(w);
  }
  auto loss = [](auto& model, const test::LmBatch& b, train::Rng) {
    return cross_entropy(model(b.inputs), b.targets);
  };
  const fs::path dir = test::hf_fixture("gpt_neox");
  auto run = [&]<typename M>(const models::Pretrained<M>& p) {
    train::Deployer deployer({.seed = 3, .quiet = true});
    train::Trainer trainer(deployer, p.model, test::collate_windows, loss, optim::adamw(1e-2f),
                           p.params);
    trainer.fit(train, {.global_batch_size = 8, .n_epochs = 1, .max_steps = 4});
    return std::pair(trainer.eval_loss(train, 8), trainer.whole_params());
  };
  const auto [lm_loss, lm_params] = run(models::from_pretrained<models::CausalLM>(dir));
  const auto [typed_loss, typed_params] = run(models::from_pretrained<models::GptNeox>(dir));
  CHECK(lm_loss == typed_loss);
  for (const auto& [k, t] : typed_params) {
    INFO(k);
    CHECK(same(lm_params.at(k), t));
  }
  // Saved through CausalLM, read back by the typed loader: the same config and tensors.
  test::TempDir out;
  const auto base = models::from_pretrained<models::CausalLM>(dir);
  models::save_pretrained<models::CausalLM>(out.path, base.config, lm_params, {}, base.hf_config);
  const auto back = models::from_pretrained<models::GptNeox>(out.path);
  CHECK(back.config.layers == models::from_pretrained<models::GptNeox>(dir).config.layers);
  for (const auto& [k, t] : lm_params) {
    INFO(k);
    CHECK(same(back.params.at(k), t));
  }
}

TEST_CASE("CausalLM builds from a config and refuses other architectures by name", "[causal_lm]") {
  const models::CausalLM fresh = models::causal_lm(
      models::OptConfig{.vocab = 64, .context = 16, .dim = 8, .layers = 1, .heads = 2, .ffn = 16});
  CHECK(fresh.family() == "opt");
  CHECK(fresh.vocab_size() == 64);
  CHECK(fresh.max_positions() == 16);
  const nn::ParamTree p = nn::init_params(fresh, 1);
  CHECK(p.size() ==
        nn::param_entries(
            models::opt(models::OptConfig{
                .vocab = 64, .context = 16, .dim = 8, .layers = 1, .heads = 2, .ffn = 16}))
            .size());
  NoGradGuard off;
  const std::vector<int64_t> v{1, 2, 3};
  const Tensor ids = Tensor::from<int64_t>(v, {1, 3});
  CHECK(nn::apply(fresh, p, ids).shape() == Shape{1, 3, 64});
  CHECK_THROWS_WITH(models::from_pretrained<models::CausalLM>(test::hf_fixture("t5")),
                    Contains("model_type 't5' is not an architecture this program takes"));
}
