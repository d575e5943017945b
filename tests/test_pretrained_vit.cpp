// ViT and ViT-GPT-2 (VisionEncoderDecoder) checkpoints: the fixtures of
// tests/fixtures/hf/vit* (tiny random models saved by the real transformers,
// tests/python/make_vit_fixtures.py) give transformers' hidden states and
// logits; 2 model shards give the 1-shard outputs; greedy and beam decoding
// with the KV cache give transformers.generate's tokens; save_pretrained
// writes the tensors back bit for bit. [live] (meson test
// pretrained_vit_live): transformers loads what redco saves and reproduces
// redco's outputs (SKIP without the venv).
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "gradcheck.hpp"
#include "hf_fixtures.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/generation/generate.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/models/hf_generation.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/train/parallel.hpp"
#include "skip.hpp"

using namespace redco;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

nn::ParamTree golden(const std::string& name) {
  return io::load_safetensors(test::hf_fixture(name) / "golden.safetensors");
}

// The ViT's last hidden state, or the encoder-decoder's logits (ctx.source = pixels).
template <typename M>
Tensor run(const M& model, const nn::ParamTree& params, const nn::ParamTree& g,
           comm::Comm* mp = nullptr) {
  NoGradGuard no_grad;
  nn::Ctx ctx;
  ctx.mp = mp;
  if constexpr (std::is_same_v<M, models::Vit>) {
    return nn::apply(model, params, g.at("pixel_values"), ctx);
  } else {
    ctx.source = g.at("pixel_values");
    return nn::apply(model, params, g.at("decoder_input_ids"), ctx);
  }
}

// Each rank's output on n model shards, every rank reading only its slices.
template <typename M>
std::vector<Tensor> sharded(const std::string& name, int n, const nn::ParamTree& g) {
  std::vector<Tensor> out(static_cast<size_t>(n));
  comm::ThreadsWorld(n).run([&](comm::Comm& comm) {
    const auto p =
        models::from_pretrained<M>(test::hf_fixture(name), {.n_shards = n, .rank = comm.rank()});
    out[size_t(comm.rank())] = run(p.model, p.params, g, &comm);
  });
  return out;
}

template <typename M>
void check_parity(const std::string& name, const char* key) {
  INFO("fixture " << name);
  const nn::ParamTree g = golden(name);
  const auto p = models::from_pretrained<M>(test::hf_fixture(name));
  const Tensor got = run(p.model, p.params, g);
  REQUIRE(got.shape() == g.at(key).shape());
  const float diff = test::max_abs_diff(got, g.at(key));
  fmt::print("{}: max |diff| vs transformers ({}): {:.2e}\n", name, key, diff);
  CHECK(diff <= 1e-4f);
  for (const Tensor& tp : sharded<M>(name, 2, g)) {
    const float rel = test::max_abs_diff(tp, got) / test::max_abs(got);
    fmt::print("{}: 2 model shards vs 1: {:.2e} relative\n", name, rel);
    CHECK(rel <= 1e-5f);
  }
}

}  // namespace

// The two rules, read off the types: attention by heads, MLPs column then
// row, the patch embedding replicated (no rule covers a convolution).
constexpr auto kVitPlan = shard::plan_v<models::Vit>;
static_assert(kVitPlan.split("layer.*.attention.q_proj.weight") == 0);
static_assert(kVitPlan.split("layer.*.attention.o_proj.weight") == 1);
static_assert(kVitPlan.split("layer.*.mlp.fc1.weight") == 0);
static_assert(kVitPlan.split("layer.*.mlp.fc2.weight") == 1);
static_assert(kVitPlan.split("embeddings.patch_embeddings.projection.weight") == -1);
static_assert(kVitPlan.split("embeddings.position_embeddings") == -1);
constexpr auto kVisionGpt2Plan = shard::plan_v<models::VisionGpt2>;
static_assert(kVisionGpt2Plan.split("decoder.h.*.crossattention.k_proj.weight") == 0);
static_assert(kVisionGpt2Plan.split("decoder.h.*.crossattention.o_proj.weight") == 1);
static_assert(kVisionGpt2Plan.split("decoder.wte.weight") == 0);
static_assert(kVisionGpt2Plan.split("encoder.layer.*.attention.k_proj.weight") == 0);

TEST_CASE("ViT checkpoints give transformers' hidden states, on 1 and 2 shards", "[hf][vit]") {
  check_parity<models::Vit>("vit", "hidden");         // 16x32 RGB, qkv biases
  check_parity<models::Vit>("vit_square", "hidden");  // int image_size, no qkv bias, gelu_new
}

TEST_CASE("ViT-GPT-2 gives transformers' logits and encoder states, on 1 and 2 shards",
          "[hf][vit]") {
  check_parity<models::VisionGpt2>("vit_gpt2", "logits");
  const nn::ParamTree g = golden("vit_gpt2");
  const auto p = models::from_pretrained<models::VisionGpt2>(test::hf_fixture("vit_gpt2"));
  NoGradGuard no_grad;
  nn::Ctx ctx;
  ctx.source = g.at("pixel_values");
  const Tensor enc = nn::encode(p.model, p.params, ctx.source, ctx);
  CHECK(test::max_abs_diff(enc, g.at("encoder_hidden")) <= 1e-4f);
}

TEST_CASE("ViT-GPT-2 greedy and beam decoding give transformers.generate's tokens", "[hf][vit]") {
  const fs::path dir = test::hf_fixture("vit_gpt2");
  const nn::ParamTree g = golden("vit_gpt2");
  const auto p = models::from_pretrained<models::VisionGpt2>(dir);
  auto cfg = models::generation_config(dir);
  cfg.max_new_tokens = cfg.min_new_tokens = 8;  // generation.json
  for (int beams : {1, 3}) {
    INFO(beams << " beams");
    cfg.num_beams = beams;
    nn::Ctx ctx;
    ctx.source = g.at("pixel_values");
    const int64_t start = p.config.decoder_start;
    const auto out = generation::generate(p.model, p.params, {{start}, {start}}, cfg, ctx);
    const Tensor want = g.at(beams == 1 ? "greedy" : "beams");  // [2, 1 + 8], start first
    REQUIRE(out.sequences.size() == 2);
    for (int64_t r = 0; r < 2; ++r) {
      const auto row = want[r].values<int64_t>();
      CHECK(out.sequences[size_t(r)] == std::vector<int64_t>(row.begin() + 1, row.end()));
    }
  }
}

TEST_CASE("ViT and ViT-GPT-2 save back the checkpoint's tensors", "[hf][vit]") {
  for (const char* name : {"vit", "vit_gpt2"}) {
    INFO(name);
    test::TempDir tmp("vit");
    const fs::path src = test::hf_fixture(name);
    if (std::string_view(name) == "vit")
      models::save_pretrained(tmp.path, models::from_pretrained<models::Vit>(src));
    else
      models::save_pretrained(tmp.path, models::from_pretrained<models::VisionGpt2>(src));
    const nn::ParamTree a = io::load_safetensors(src / "model.safetensors");
    const nn::ParamTree b = io::load_safetensors(tmp.path / "model.safetensors");
    size_t compared = 0;
    for (const auto& [k, t] : a) {
      if (k.find("pooler") != std::string::npos || k == "decoder.lm_head.weight") continue;
      REQUIRE(b.count(k));
      CHECK(t.values<float>() == b.at(k).values<float>());
      ++compared;
    }
    CHECK(compared == b.size());
  }
}

TEST_CASE("a ViT-GPT-2 training step on 2 model shards gives the 1-shard loss and gradients",
          "[vit]") {
  const auto model = models::vision_gpt2(
      {.encoder = {.channels = 1,
                   .height = 8,
                   .width = 16,
                   .patch = 4,
                   .dim = 16,
                   .layers = 1,
                   .heads = 4,
                   .inner = 32,
                   .dropout = 0.1f},
       .decoder = {
           .vocab = 16, .context = 8, .dim = 16, .layers = 1, .heads = 4, .dropout = 0.1f}});
  const Tensor images = Tensor::normal({2, 1, 8, 16}, 7, 1, 0.f, 1.f);  // [B, C, H, W]
  const std::vector<int64_t> in{1, 5, 9, 2, 7, 1, 3, 3, 14, 0},
      out{5, 9, 2, 7, -100, 3, 3, 14, 0, 8};
  const Tensor ids = Tensor::from<int64_t>(std::span(in), {2, 5}),
               labels = Tensor::from<int64_t>(std::span(out), {2, 5});
  auto step = [&](const nn::ParamTree& params, comm::Comm* mp) {
    return value_and_grad(
        [&](const nn::ParamTree& p) {
          nn::Ctx ctx{.train = true, .seed = 3, .step = 2};  // dropout on
          ctx.mp = mp, ctx.source = images;
          return cross_entropy(nn::apply(model, p, ids, ctx), labels);
        },
        params);
  };
  const auto [want_loss, want] = step(nn::init_params(model, 5), nullptr);
  const auto plan = shard::resolve(model, 2);
  std::vector<std::pair<float, nn::ParamTree>> got(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    auto [loss, grads] =
        step(train::init_shard(nn::param_entries(model), plan, 5, comm.rank(), 2), &comm);
    got[size_t(comm.rank())] = {loss.item(), std::move(grads)};
  });
  size_t split = 0;
  for (int r = 0; r < 2; ++r) {
    CHECK(std::abs(got[size_t(r)].first - want_loss.item()) <= 1e-5f * want_loss.item());
    for (const shard::ParamSplit& s : plan) {
      INFO("rank " << r << ": " << s.name);
      const Tensor slice = train::slice_shard(want.at(s.name), s, r, 2);
      CHECK(test::max_abs_diff(got[size_t(r)].second.at(s.name), slice) <=
            1e-5f * std::max(test::max_abs(slice), 1e-3f));
      split += r == 0 && s.split_dim >= 0;
    }
  }
  // Encoder layer: q/k/v/o + q/k/v biases, fc1 + its bias, fc2 (10); decoder layer: self- and
  // cross-attention (7 each), fc1 + bias, fc2 (3); wte. The patch embedding stays whole.
  CHECK(split == 10 + 17 + 1);
}

TEST_CASE("ViT errors name the key or the shape", "[hf][vit]") {
  io::Json j = models::hf::Config(test::hf_fixture("vit_gpt2")).json();
  j["encoder"]["hidden_size"] = 48;
  CHECK_THROWS_WITH(models::vision_gpt2_config(models::hf::Config(j, "cfg")),
                    Contains("hidden_size 48") && Contains("enc_to_dec_proj"));
  j = models::hf::Config(test::hf_fixture("vit")).json();
  j["image_size"] = 20;
  CHECK_THROWS_WITH(models::vit_config(models::hf::Config(j, "cfg")),
                    Contains("image_size") && Contains("8x8 patches"));
  j["image_size"] = "big";
  CHECK_THROWS_WITH(models::vit_config(models::hf::Config(j, "cfg")), Contains("image_size"));
  const auto p = models::from_pretrained<models::Vit>(test::hf_fixture("vit"));
  CHECK_THROWS_WITH(nn::apply(p.model, p.params, Tensor::zeros({1, 3, 16, 16})),
                    Contains("[N, 3, 16, 32]"));
}

TEST_CASE("transformers loads redco's ViT and ViT-GPT-2 saves and gives redco's outputs",
          "[live]") {
  const fs::path root = test::hf_fixture().parent_path().parent_path().parent_path();
  const std::string python = test::python_or_skip(root, "transformers, safetensors");
  test::TempDir tmp("vit-live");
  auto save_changed = [&]<typename M>(const char* name) {
    auto p = models::from_pretrained<M>(test::hf_fixture(name));
    for (auto& [k, t] : p.params) t = add(mul(t, 1.02f), 0.001f);  // not the fixture's weights
    const nn::ParamTree g = golden(name);
    nn::ParamTree out{{"output", run(p.model, p.params, g)},
                      {"pixel_values", g.at("pixel_values")}};
    if (g.count("decoder_input_ids")) out["decoder_input_ids"] = g.at("decoder_input_ids");
    models::save_pretrained(tmp.path / name, p);
    io::save_safetensors(tmp.path / name / "redco_outputs.safetensors", out, {{"format", "pt"}});
  };
  save_changed.operator()<models::Vit>("vit");
  save_changed.operator()<models::VisionGpt2>("vit_gpt2");
  const std::string cmd = fmt::format(
      "'{}' '{}' '{}' '{}'", python, (root / "tests/python/check_vit_roundtrip.py").string(),
      (tmp.path / "vit").string(), (tmp.path / "vit_gpt2").string());
  CHECK(std::system(cmd.c_str()) == 0);
}
