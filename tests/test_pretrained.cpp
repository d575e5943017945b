// Hugging Face checkpoints: every fixture of tests/fixtures/hf (tiny random
// models saved by the real transformers, tests/python/make_hf_fixtures.py)
// loads into its typed redco model and gives the reference logits; under
// tensor parallelism each rank reads only its slices and the logits equal the
// 1-shard ones; save_pretrained writes what load reads back bit for bit; bad
// folders fail with one message naming the culprit. The hidden [live] case
// (meson test 'pretrained_live') has transformers load what redco saves.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "gradcheck.hpp"
#include "hf_fixtures.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/core/allocator.hpp"
#include "redco/core/philox.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/train/export_pretrained.hpp"
#include "redco/train/parallel.hpp"
#include "redco/train/trainer.hpp"
#include "skip.hpp"

using namespace redco;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

fs::path fixtures() { return test::hf_fixture(); }
using test::TempDir;

struct Golden {
  Tensor ids, logits;
  Tensor mask, padded_logits;  // a left-, a right- and an unpadded row
};
Golden golden(const std::string& name) {
  const nn::ParamTree g = io::load_safetensors(fixtures() / name / "golden.safetensors");
  Golden out{g.at("input_ids"), g.at("logits"), {}, {}};
  if (g.count("attention_mask"))
    out.mask = g.at("attention_mask"), out.padded_logits = g.at("padded_logits");
  return out;
}

using test::max_abs;
using test::max_diff_unpadded;

template <typename M>
Tensor logits_of(const models::Pretrained<M>& p, const Tensor& ids) {
  NoGradGuard no_grad;
  return nn::apply(p.model, p.params, ids);
}

// The model's logits from rank-sharded parameters read by each rank itself.
template <typename M>
Tensor sharded_logits(const fs::path& dir, int n, const Tensor& ids) {
  std::vector<Tensor> out(static_cast<size_t>(n));
  comm::ThreadsWorld(n).run([&](comm::Comm& comm) {
    const auto p = models::from_pretrained<M>(dir, {.n_shards = n, .rank = comm.rank()});
    NoGradGuard no_grad;
    nn::Ctx ctx;
    ctx.mp = &comm;
    out[size_t(comm.rank())] = nn::apply(p.model, p.params, ids, ctx);
  });
  return out[0];
}

template <typename M>
void check_family(const std::string& name, std::vector<int> shard_counts) {
  INFO("fixture " << name);
  const Golden g = golden(name);
  const auto p = models::from_pretrained<M>(fixtures() / name);
  const Tensor got = logits_of(p, g.ids);
  REQUIRE(got.shape() == g.logits.shape());
  const float diff = test::max_abs_diff(got, g.logits);
  CHECK(diff <= 1e-4f);
  std::string report =  // the measured parity (docs/models.md quotes it)
      fmt::format("{}: max |redco - transformers| {:.2g} (max |logit| {:.2g})", name, diff,
                  max_abs(got));
  if (g.mask.defined()) {  // a padded batch: left, right and no padding
    NoGradGuard no_grad;
    // The forward call README.md and models/pretrained.hpp document.
    const Tensor padded = nn::apply(p.model, p.params, g.ids, {.mask = g.mask});
    const float pdiff = max_diff_unpadded(padded, g.padded_logits, g.mask);
    CHECK(pdiff <= 1e-4f);
    CHECK(max_diff_unpadded(padded, g.logits, g.mask) > 1e-3f);  // the mask changed something
    report += fmt::format(", padded batch {:.2g}", pdiff);
  }
  for (int n : shard_counts) {
    INFO(n << " model shards");
    const Tensor tp = sharded_logits<M>(fixtures() / name, n, g.ids);
    const float rel = test::max_abs_diff(tp, got) / max_abs(got);
    CHECK(rel <= 1e-5f);
    report += fmt::format("; {} shards vs 1: {:.2g} relative", n, rel);
  }
  fmt::print("{}\n", report);
}

}  // namespace

TEST_CASE("GPT-2 checkpoints give transformers' logits, sharded or not", "[hf][gpt2]") {
  check_family<models::Gpt2>("gpt2", {2, 4});
  check_family<models::Gpt2>("gpt2_variants", {2});
}

TEST_CASE("LLaMA, Mistral and Qwen2 checkpoints give transformers' logits", "[hf][llama]") {
  check_family<models::Llama>("llama", {2});
  check_family<models::Llama>("llama_head_dim", {2, 4});
  check_family<models::Llama>("llama3_tied", {2});
  check_family<models::Llama>("mistral", {2});
  check_family<models::Llama>("qwen2", {});  // one kv head: nothing to split by heads
}

TEST_CASE("OPT checkpoints (pre-LN; post-LN with projections) give transformers' logits",
          "[hf][opt]") {
  check_family<models::Opt>("opt", {2, 4});
  check_family<models::Opt>("opt_post_ln_proj", {2, 4});
}

TEST_CASE("GPT-J checkpoints (interleaved partial rotary, biased head) give transformers' logits",
          "[hf][gptj]") {
  check_family<models::Gptj>("gptj", {2, 4});
  check_family<models::Gptj>("gptj_full_rotary_tied", {2, 4});
}

TEST_CASE("GPT-NeoX checkpoints (parallel and sequential residual) give transformers' logits",
          "[hf][gpt_neox]") {
  check_family<models::GptNeox>("gpt_neox", {2, 4});
  check_family<models::GptNeox>("gpt_neox_sequential", {2, 4});
}

TEST_CASE("GPT-J's rotary pairs are reordered to rotate-half within each head", "[hf][gptj]") {
  using V = std::vector<int64_t>;
  CHECK(models::interleaved_to_half_rows(1, 8, 4) == V{0, 2, 1, 3, 4, 5, 6, 7});
  CHECK(models::interleaved_to_half_rows(2, 4, 4) == V{0, 2, 1, 3, 4, 6, 5, 7});
  // Loaded in the file's order instead, the same weights give other logits:
  // the permutation is what makes the fixture pass, not an accident of it.
  const Golden g = golden("gptj");
  auto p = models::from_pretrained<models::Gptj>(fixtures() / "gptj");
  const nn::ParamTree file = io::load_safetensors(fixtures() / "gptj" / "model.safetensors");
  for (const char* w : {"q_proj", "k_proj"})
    for (int l = 0; l < 2; ++l)
      p.params[fmt::format("h.{}.attn.{}.weight", l, w)] =
          file.at(fmt::format("transformer.h.{}.attn.{}.weight", l, w));
  CHECK(test::max_abs_diff(logits_of(p, g.ids), g.logits) > 1e-2f);
}

TEST_CASE("each rank's slices equal the slices of the whole parameters", "[hf]") {
  for (const char* name : {"gpt2", "llama_head_dim", "gptj", "gpt_neox", "opt_post_ln_proj"}) {
    INFO(name);
    const fs::path dir = fixtures() / name;
    const auto whole = models::from_pretrained_any(dir);
    std::visit(
        [&](const auto& p) {
          const auto plan = shard::resolve(p.model, 2);
          for (int r = 0; r < 2; ++r) {
            using M = std::decay_t<decltype(p.model)>;
            const auto part = models::from_pretrained<M>(dir, {.n_shards = 2, .rank = r});
            const nn::ParamTree want = train::shard_params(p.params, plan, r, 2);
            REQUIRE(part.params.size() == want.size());
            for (const auto& [k, t] : want) {
              INFO(k);
              CHECK(test::max_abs_diff(part.params.at(k), t) == 0.f);
            }
          }
        },
        whole);
  }
}

TEST_CASE("save_pretrained writes what from_pretrained reads, in HF layout", "[hf]") {
  for (const char* name : {"gpt2_variants", "llama3_tied", "qwen2", "opt", "opt_post_ln_proj",
                           "gptj", "gptj_full_rotary_tied", "gpt_neox", "gpt_neox_sequential"}) {
    INFO(name);
    TempDir out;
    const auto p = models::from_pretrained_any(fixtures() / name);
    std::visit(
        [&](const auto& m) {
          using M = std::decay_t<decltype(m.model)>;
          models::save_pretrained(out.path, m);
          // Same tensor names, shapes and bytes as the file transformers wrote.
          const nn::ParamTree ref = io::load_safetensors(fixtures() / name / "model.safetensors");
          const nn::ParamTree mine = io::load_safetensors(out.path / "model.safetensors");
          REQUIRE(mine.size() == ref.size());
          for (const auto& [k, t] : ref) {
            INFO(k);
            REQUIRE(mine.count(k));
            CHECK(test::max_abs_diff(mine.at(k), t) == 0.f);
          }
          const auto back = models::from_pretrained<M>(out.path);
          for (const auto& [k, t] : m.params)
            CHECK(test::max_abs_diff(back.params.at(k), t) == 0.f);
        },
        p);
  }
}

TEST_CASE("sharded saves with an index, bf16 on disk", "[hf]") {
  TempDir out;
  const auto p = models::from_pretrained<models::Llama>(fixtures() / "llama");
  models::save_pretrained(out.path, p, {.dtype = DType::bf16, .max_shard_bytes = 20'000});
  CHECK(fs::exists(out.path / "model.safetensors.index.json"));
  CHECK(!fs::exists(out.path / "model.safetensors"));
  CHECK(fs::exists(out.path / "model-00003-of-00003.safetensors"));  // 43 kB in bf16
  const auto back = models::from_pretrained<models::Llama>(out.path);
  for (const auto& [k, t] : p.params) {
    INFO(k);
    const Tensor rounded = t.to(DType::bf16).to(DType::f32);
    CHECK(test::max_abs_diff(back.params.at(k), rounded) == 0.f);
  }
  // bf16 weights loaded as bf16 parameters.
  const auto half = models::from_pretrained<models::Llama>(out.path, {.dtype = DType::bf16});
  CHECK(half.params.at("norm.weight").dtype() == DType::bf16);
}

namespace {

void copy_fixture(const std::string& name, const fs::path& to) {
  fs::copy(fixtures() / name, to, fs::copy_options::recursive);
}
void edit_config(const fs::path& dir, const std::string& from, const std::string& to) {
  std::ifstream in(dir / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << text;
}

}  // namespace

TEST_CASE("bad checkpoint folders fail with one message naming the culprit", "[hf][errors]") {
  using models::Gpt2, models::Llama;
  TempDir t;
  const fs::path d = t.path / "m";
  auto fresh = [&](const char* name) {
    fs::remove_all(d);
    copy_fixture(name, d);
  };
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(t.path / "nowhere"), Contains("does not exist"));
  fresh("gpt2");
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(d),
                    Contains("'gpt2' model") && Contains("models::Llama"));
  edit_config(d, "\"n_embd\": 32", "\"n_embd\": \"32\"");
  CHECK_THROWS_WITH(models::from_pretrained<Gpt2>(d), Contains("'n_embd' must be an integer"));
  fresh("gpt2");
  edit_config(d, "\"n_head\": 4,", "");
  CHECK_THROWS_WITH(models::from_pretrained<Gpt2>(d), Contains("'n_head' is missing"));
  fresh("gpt2");
  edit_config(d, "\"n_embd\": 32", "\"n_embd\": 36");
  CHECK_THROWS_WITH(models::from_pretrained<Gpt2>(d),
                    Contains("has shape") && Contains("config.json implies"));
  // Sizes must be at least 1 and integers in range (found by fuzz_hf_config).
  fresh("llama");
  edit_config(d, "\"num_attention_heads\": 4", "\"num_attention_heads\": 0");
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(d),
                    Contains("'num_attention_heads' = 0 must be a size of at least 1"));
  fresh("llama");
  edit_config(d, "\"hidden_size\": 32", "\"hidden_size\": 3e90");
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(d),
                    Contains("'hidden_size' must be an integer"));
  fresh("llama");
  edit_config(d, "\"model_type\": \"llama\"", "\"model_type\": \"falcon\"");
  CHECK_THROWS_WITH(models::from_pretrained_any(d), Contains("'falcon' is not one redco loads"));
  fresh("llama");
  edit_config(d, "\"rope_scaling\": null",
              "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2}");
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(d), Contains("\"yarn\""));
  fresh("llama");
  edit_config(d, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(d),
                    Contains("model.layers.2.input_layernorm.weight") && Contains("missing"));
  edit_config(d, "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 1");
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(d),
                    Contains("unexpected tensor 'model.layers.1."));
  // Weights: truncated, missing, an index naming a missing shard, integer weights.
  fresh("llama");
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 100);
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(d), Contains("model.safetensors"));
  fs::remove(d / "model.safetensors");
  CHECK_THROWS_WITH(models::from_pretrained<Llama>(d), Contains("holds no model.safetensors"));
  {
    const auto p = models::from_pretrained<Llama>(fixtures() / "llama");
    models::save_pretrained(d, p, {.max_shard_bytes = 30'000});  // 87 kB: 4 files
    fs::remove(d / "model-00002-of-00004.safetensors");
    CHECK_THROWS_WITH(models::from_pretrained<Llama>(d),
                      Contains("model-00002-of-00004.safetensors") && Contains("missing"));
    fresh("llama");
    nn::ParamTree w = io::load_safetensors(d / "model.safetensors");
    w["model.norm.weight"] = Tensor::zeros(Shape{32}, DType::i32);
    io::save_safetensors(d / "model.safetensors", w, {{"format", "pt"}});
    CHECK_THROWS_WITH(models::from_pretrained<Llama>(d),
                      Contains("model.norm.weight") && Contains("I32"));
  }
}

TEST_CASE("bad OPT, GPT-J and GPT-NeoX folders fail naming the key or tensor", "[hf][errors]") {
  using models::GptNeox, models::Gptj, models::Opt;
  TempDir t;
  const fs::path d = t.path / "m";
  auto fresh = [&](const char* name) {
    fs::remove_all(d);
    copy_fixture(name, d);
  };
  fresh("opt");
  CHECK_THROWS_WITH(models::from_pretrained<Gptj>(d),
                    Contains("'opt' model") && Contains("models::Gptj"));
  edit_config(d, "\"enable_bias\": true", "\"enable_bias\": false");
  CHECK_THROWS_WITH(models::from_pretrained<Opt>(d), Contains("'enable_bias'"));
  fresh("opt");  // pre-LN weights read as post-LN: the final norm is one tensor too many
  edit_config(d, "\"do_layer_norm_before\": true", "\"do_layer_norm_before\": false");
  CHECK_THROWS_WITH(models::from_pretrained<Opt>(d),
                    Contains("unexpected tensor 'model.decoder.final_layer_norm."));
  fresh("gptj");
  edit_config(d, "\"rotary_dim\": 4", "\"rotary_dim\": 5");
  CHECK_THROWS_WITH(models::from_pretrained<Gptj>(d), Contains("'rotary_dim'") && Contains("even"));
  edit_config(d, "\"rotary_dim\": 5", "\"rotary_dim\": null");
  CHECK_THROWS_WITH(models::from_pretrained<Gptj>(d), Contains("'rotary_dim' is missing"));
  fresh("gpt_neox");
  edit_config(d, "\"rotary_pct\": 0.5", "\"rotary_pct\": 0.375");  // 3 of 8 dimensions
  CHECK_THROWS_WITH(models::from_pretrained<GptNeox>(d),
                    Contains("'rotary_pct'") && Contains("even"));
  fresh("gpt_neox");
  edit_config(d, "\"rope_scaling\": null",
              "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}");
  CHECK_THROWS_WITH(models::from_pretrained<GptNeox>(d), Contains("'rope_scaling'"));
  fresh("gpt_neox");  // the same weights run sequentially give other logits: the flag is read
  edit_config(d, "\"use_parallel_residual\": true", "\"use_parallel_residual\": false");
  const Golden g = golden("gpt_neox");
  CHECK(test::max_abs_diff(logits_of(models::from_pretrained<GptNeox>(d), g.ids), g.logits) >
        1e-2f);
}

// ---- live round trip with transformers (meson test 'pretrained_live') -----------------------
namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";  // close, an escaped quote, reopen
    else
      out += c;
  }
  return out + "'";
}

// Weights drawn so logits are O(1) (a wrong config then moves them visibly):
// norms near 1, matrices with a spread of 1.5 / sqrt(fan-in), vectors 0.3.
template <typename M>
nn::ParamTree spread_params(const M& model) {
  nn::ParamTree p;
  uint64_t stream = 77;
  for (const nn::ParamEntry& e : nn::param_entries(model)) {
    const std::string name(e.name.view());
    const Shape s = e.shape.shape();
    const bool norm =
        name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos;
    const float std = norm ? 0.2f : s.rank() == 2 ? 1.5f / std::sqrt(float(s[1])) : 0.3f;
    Tensor t = Tensor::normal(s, 11, stream++, 0.f, std);
    p.emplace(name, norm && name.ends_with("weight") ? t + 1.f : t);
  }
  return p;
}

// Saves (model, params) with an empty base config.json, and redco's logits beside it.
template <typename M>
void save_fresh(const fs::path& dir, const typename models::HfFamily<M>::Config& c,
                const Tensor& ids) {
  const M model = models::HfFamily<M>::build(c);
  const nn::ParamTree params = spread_params(model);
  models::save_pretrained<M>(dir, c, params);
  NoGradGuard no_grad;
  io::save_safetensors(dir / "redco_logits.safetensors",
                       {{"input_ids", ids}, {"logits", nn::apply(model, params, ids)}}, {});
}

}  // namespace

// Hidden from the default run: needs the venv's torch and transformers, and
// exits 77 (skip) when they are missing.
TEST_CASE("transformers loads what save_pretrained writes, with redco's logits", "[.live]") {
  const char* env = std::getenv("REDCO_VENV");
  const fs::path root = fixtures().parent_path().parent_path().parent_path();
  const fs::path python = (env && *env ? fs::path(env) : root / ".venv") / "bin" / "python";
  if (!fs::exists(python))
    test::skip("no Python venv at " + python.string() + " (tools/setup test, or set REDCO_VENV)");
  TempDir t;
  std::string args;  // folder, logits file, folder, ...
  auto add = [&](const fs::path& dir, const fs::path& logits) {
    args.append(" ").append(quote(dir.string())).append(" ").append(quote(logits.string()));
  };
  // Fixtures read and written back (config.json keeps the file's other keys)...
  for (const char* name :
       {"gpt2_variants", "llama_head_dim", "llama3_tied", "mistral", "qwen2", "opt",
        "opt_post_ln_proj", "gptj", "gptj_full_rotary_tied", "gpt_neox", "gpt_neox_sequential"}) {
    std::visit([&](const auto& m) { models::save_pretrained(t.path / name, m); },
               models::from_pretrained_any(fixtures() / name));
    add(t.path / name, fixtures() / name / "golden.safetensors");
  }
  // ...and models redco made, with config.json written from scratch.
  const Tensor ids = golden("opt").ids;
  save_fresh<models::Opt>(t.path / "fresh_opt",
                          {.vocab = 96,
                           .context = 16,
                           .dim = 16,
                           .layers = 2,
                           .heads = 2,
                           .ffn = 24,
                           .embed_dim = 8,
                           .pre_norm = false,
                           .final_norm = false},
                          ids);
  save_fresh<models::Gptj>(t.path / "fresh_gptj",
                           {.vocab = 96,
                            .context = 16,
                            .dim = 16,
                            .layers = 2,
                            .heads = 2,
                            .rotary_dim = 4,
                            .inner = 24},
                           ids);
  save_fresh<models::GptNeox>(t.path / "fresh_neox",
                              {.vocab = 96,
                               .dim = 16,
                               .layers = 2,
                               .heads = 2,
                               .hidden = 24,
                               .rotary_dim = 4,
                               .parallel_residual = false,
                               .context = 16},
                              ids);
  save_fresh<models::Gpt2>(
      t.path / "fresh_gpt2",
      {.vocab = 96, .context = 16, .dim = 16, .layers = 2, .heads = 2, .inner = 24}, ids);
  save_fresh<models::Llama>(t.path / "fresh_llama",
                            {.vocab = 96,
                             .dim = 16,
                             .layers = 2,
                             .heads = 4,
                             .kv_heads = 2,
                             .hidden = 24,
                             .rope = {.base = 500.f,
                                      .scaling = nn::RopeScaling::llama3,
                                      .factor = 4.f,
                                      .original_max_positions = 8},
                             .head_dim = 6,
                             .tie_embeddings = true,
                             .context = 16},
                            ids);
  for (const char* name : {"fresh_opt", "fresh_gptj", "fresh_neox", "fresh_gpt2", "fresh_llama"})
    add(t.path / name, t.path / name / "redco_logits.safetensors");
  std::string cmd = quote(python.string());
  cmd.append(" ").append(quote((root / "tests" / "python" / "hf_logits.py").string())).append(args);
  FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(pipe);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  fmt::print("{}", out);  // transformers' max |difference| per folder
  INFO(out);
  if (rc == 77) test::skip(out);
  CHECK(rc == 0);
}

namespace {
struct LmExample {
  std::vector<int64_t> ids;  // 9 tokens: inputs are the first 8, targets the last 8
};
struct LmBatch {
  Tensor inputs, targets;
};
LmBatch lm_collate(std::span<const LmExample> ex) {
  const auto n = int64_t(ex.size());
  LmBatch b{Tensor::empty({n, 8}, DType::i64), Tensor::empty({n, 8}, DType::i64)};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < 8; ++t) {
      b.inputs.data<int64_t>()[i * 8 + t] = ex[size_t(i)].ids[size_t(t)];
      b.targets.data<int64_t>()[i * 8 + t] = ex[size_t(i)].ids[size_t(t + 1)];
    }
  return b;
}
}  // namespace

TEST_CASE("a checkpoint fine-tuned 20 steps exports and re-imports exactly", "[hf]") {
  const auto p = models::from_pretrained<models::Llama>(fixtures() / "llama3_tied");
  std::vector<LmExample> train;
  for (uint64_t i = 0; i < 64; ++i) {  // a learnable pattern: t -> t + 3 (mod 96)
    LmExample e;
    e.ids.push_back(int64_t(philox_bits(5, 0, i) % 96));
    for (int t = 1; t < 9; ++t) e.ids.push_back((e.ids.back() + 3) % 96);
    train.push_back(e);
  }
  auto loss = [](auto& model, const LmBatch& b, train::Rng) {
    return cross_entropy(model(b.inputs), b.targets);
  };
  train::Deployer deployer({.seed = 3, .quiet = true});
  train::Trainer trainer(deployer, p.model, lm_collate, loss, optim::adamw(1e-2f), p.params);
  trainer.fit(train, {.global_batch_size = 16, .n_epochs = 5, .max_steps = 20});
  const nn::ParamTree tuned = trainer.whole_params();
  // (p.params shares its storage with the Trainer's: compare with a fresh load.)
  const auto before = models::from_pretrained<models::Llama>(fixtures() / "llama3_tied");
  CHECK(test::max_abs_diff(tuned.at("norm.weight"), before.params.at("norm.weight")) > 1e-3f);
  TempDir out;  // one call: config.json, safetensors and the tokenizer beside it
  const fs::path tokenizer = fixtures() / "../../data/tokenizers/gpt2/tokenizer.json";
  train::export_pretrained(trainer, out.path, p, tokenizer);
  CHECK(fs::file_size(out.path / "tokenizer.json") == fs::file_size(tokenizer));
  const models::hf::Config saved(out.path);  // keys redco does not model are kept
  CHECK(saved.integer("bos_token_id") == 1);
  CHECK(saved.number("initializer_range") == 0.02);
  const auto back = models::from_pretrained<models::Llama>(out.path);
  REQUIRE(back.params.size() == tuned.size());
  for (const auto& [k, t] : tuned) {
    INFO(k);
    CHECK(test::max_abs_diff(back.params.at(k), t) == 0.f);
  }
}

TEST_CASE("with_family<Only...> takes the named architectures and refuses the rest", "[hf]") {
  auto layers = [&]<typename M>() {
    return models::from_pretrained<M>(fixtures() / "qwen2").config.layers;
  };
  CHECK(models::with_family<models::Gpt2, models::Llama>(fixtures() / "qwen2", layers) ==
        models::from_pretrained<models::Llama>(fixtures() / "qwen2").config.layers);
  CHECK_THROWS_WITH((models::with_family<models::Gpt2, models::Llama>(fixtures() / "bart", layers)),
                    Catch::Contains("model_type 'bart' is not an architecture this program takes"));
}

namespace {
// VmHWM / VmRSS of this process in kB (Linux).
int64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  return -1;
}
// Peak resident growth of f() in MB: the peak counter is reset first
// (clear_refs 5), so a peak before f() does not count; skips (77) where the
// kernel or the sandbox does not allow the reset.
double peak_growth_mb(const std::function<void()>& f) {
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t before = status_kb("VmRSS:");
  if (before < 0 || status_kb("VmHWM:") > before + 4096)
    test::skip("cannot reset the peak RSS counter (/proc/self/clear_refs), so cannot measure");
  f();
  return double(status_kb("VmHWM:") - before) / 1024.0;
}
}  // namespace

// Hidden from the default run (meson test pretrained_memory runs it): it skips
// where the peak RSS counter cannot be reset.
TEST_CASE("a model shard loads in about its own memory, never the whole model's", "[.memory]") {
  // LLaMA of 139 MB in f32 (vocab 8000, d 512, 8 layers), written by redco.
  const models::LlamaConfig c{.vocab = 8000,
                              .dim = 512,
                              .layers = 8,
                              .heads = 8,
                              .kv_heads = 4,
                              .hidden = 1536,
                              .context = 256};
  TempDir dir;
  {
    const auto model = models::llama(c);
    models::save_pretrained<models::Llama>(dir.path, c, nn::init_params(model, 1));
  }
  const double full_mb = double(fs::file_size(dir.path / "model.safetensors")) / (1 << 20);
  CachingAllocator::cpu().empty_cache();  // freed blocks would hide the load's allocations
  nn::ParamTree shard;
  const double shard_mb = peak_growth_mb([&] {
    shard = models::from_pretrained<models::Llama>(dir.path, {.n_shards = 4, .rank = 1}).params;
  });
  const double shard_bytes = double(nn::count_parameters(shard)) * 4 / (1 << 20);
  fmt::print(
      "a 1/4 shard of a {:.0f} MB checkpoint: {:.1f} MB of parameters, peak RSS growth "
      "{:.1f} MB\n",
      full_mb, shard_bytes, shard_mb);
  CHECK(shard_bytes < 0.3 * full_mb);
  CHECK(shard_mb < shard_bytes + 0.1 * full_mb);  // the shard and small read buffers, no more
}

TEST_CASE("gradients of imported models on 2 shards are the slices of the 1-shard ones",
          "[hf][tp]") {
  for (const char* name : {"gpt2_variants", "llama_head_dim", "llama3_tied"}) {
    INFO(name);
    const Golden g = golden(name);
    std::visit(
        [&](const auto& whole) {
          using M = std::decay_t<decltype(whole.model)>;
          // Next-token loss over the golden ids: targets are the inputs shifted by one.
          const int64_t T = g.ids.dim(1) - 1;
          const Tensor in = slice(g.ids, 1, 0, T).clone(), out = slice(g.ids, 1, 1, T + 1).clone();
          auto loss_of = [&](const M& model, const nn::ParamTree& p, nn::Ctx ctx) {
            ctx.train = true;
            return cross_entropy(nn::apply(model, p, in, ctx), out);
          };
          auto [want_loss, want] = value_and_grad(
              [&](const nn::ParamTree& p) { return loss_of(whole.model, p, {}); }, whole.params);
          const auto plan = shard::resolve(whole.model, 2);
          std::vector<nn::ParamTree> got(2);
          std::vector<float> losses(2);
          comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
            const auto part =
                models::from_pretrained<M>(fixtures() / name, {.n_shards = 2, .rank = comm.rank()});
            nn::Ctx ctx;
            ctx.mp = &comm;
            auto [l, gr] = value_and_grad(
                [&](const nn::ParamTree& p) { return loss_of(part.model, p, ctx); }, part.params);
            got[size_t(comm.rank())] = std::move(gr), losses[size_t(comm.rank())] = l.item();
          });
          // A tensor whose true gradient is zero (a key bias: softmax ignores
          // it) holds only rounding noise, so the tolerance's floor is set by
          // the model's largest gradient, not by the tensor's own.
          float scale = 0.f;
          for (const auto& [n, t] : want) scale = std::max(scale, max_abs(t));
          for (int r = 0; r < 2; ++r) {
            CHECK(std::abs(losses[size_t(r)] - want_loss.item()) <= 1e-5f * want_loss.item());
            for (const shard::ParamSplit& s : plan) {
              INFO(s.name << " rank " << r);
              const Tensor slice_want = train::slice_shard(want.at(s.name), s, r, 2);
              CHECK(test::max_abs_diff(got[size_t(r)].at(s.name), slice_want) <=
                    1e-5f * std::max(max_abs(slice_want), 1e-2f * scale));
            }
          }
        },
        models::from_pretrained_any(fixtures() / name));
  }
}
