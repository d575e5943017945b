// The compile-time shard plans of typed models: the two rules, checked with
// static_assert on the model types themselves.
#include <catch2/catch.hpp>

#include "redco/models/llama.hpp"
#include "redco/models/t5.hpp"
#include "redco/nn/shard_plan.hpp"

using namespace redco;
using shard::Role;

namespace {
// GPT-2: tied head, learned positions, GELU MLP, biases everywhere.
auto gpt2(int64_t vocab, int64_t ctx, int64_t d, int64_t heads, int64_t layers) {
  return (nn::embedding(vocab, d) + nn::positions(ctx, d)) |
         nn::repeat(layers, nn::residual(nn::layer_norm(d) | nn::causal_attention(d, heads)) |
                                nn::residual(nn::layer_norm(d) | nn::mlp(d, 4 * d))) |
         nn::named<"ln_f">(nn::layer_norm(d)) | nn::tied_lm_head(vocab);
}
using Gpt2 = decltype(gpt2(0, 0, 0, 1, 0));
constexpr auto gpt2_plan = shard::plan_v<Gpt2>;

static_assert(gpt2_plan.params.size() == 2 + 16 + 2);  // 16 per layer: 2 + 8 + 2 + 4
static_assert(gpt2_plan.role("wte.weight") == Role::vocab);
static_assert(gpt2_plan.split("wte.weight") == 0);
static_assert(gpt2_plan.split("wpe.weight") == -1);
static_assert(gpt2_plan.split("h.*.ln_1.weight") == -1);
static_assert(gpt2_plan.split("h.*.attn.q_proj.weight") == 0);
static_assert(gpt2_plan.split("h.*.attn.k_proj.weight") == 0);
static_assert(gpt2_plan.split("h.*.attn.v_proj.weight") == 0);
static_assert(gpt2_plan.split("h.*.attn.q_proj.bias") == 0);
static_assert(gpt2_plan.split("h.*.attn.o_proj.weight") == 1);
static_assert(gpt2_plan.split("h.*.attn.o_proj.bias") == -1);
static_assert(gpt2_plan.split("h.*.mlp.fc1.weight") == 0);
static_assert(gpt2_plan.split("h.*.mlp.fc1.bias") == 0);
static_assert(gpt2_plan.split("h.*.mlp.fc2.weight") == 1);
static_assert(gpt2_plan.split("h.*.mlp.fc2.bias") == -1);
static_assert(gpt2_plan.split("ln_f.weight") == -1);
// One all-reduce per block per direction: attention and MLP in each layer,
// plus the embedding's vocabulary-split lookup; no all-gathers anywhere.
static_assert(gpt2_plan.count(nn::Collective::all_reduce) == 3);
static_assert(gpt2_plan.count(nn::Collective::all_gather) == 0);
static_assert(gpt2_plan.count(nn::Collective::vocab_logits) == 1);
// 50257 does not divide by 2: the plan says so at compile time.
static_assert(gpt2_plan.split_if_divisible("wte.weight", 50257, 2) == -1);
static_assert(gpt2_plan.split_if_divisible("wte.weight", 50304, 2) == 0);
static_assert(gpt2_plan.split_if_divisible("h.*.attn.q_proj.weight", 768, 4, 64) == 0);
static_assert(gpt2_plan.split_if_divisible("h.*.attn.q_proj.weight", 768, 5, 64) == -1);

// An MLP chain: the alternation follows execution order, not names.
using Chain = decltype(nn::linear(8, 16) | nn::relu() | nn::linear(16, 16) | nn::relu() |
                       nn::linear(16, 16) | nn::linear(16, 4));
constexpr auto chain_plan = shard::plan_v<Chain>;
static_assert(chain_plan.split("fc_1.weight") == 0 && chain_plan.split("fc_2.weight") == 1);
static_assert(chain_plan.split("fc_3.weight") == 0 && chain_plan.split("fc_4.weight") == 1);
static_assert(chain_plan.split("fc_1.bias") == 0 && chain_plan.split("fc_2.bias") == -1);
static_assert(chain_plan.count(nn::Collective::all_reduce) == 2);
static_assert(chain_plan.count(nn::Collective::all_gather) == 0);
// An odd chain ends column-parallel: its split output is gathered at the end.
using OddChain = decltype(nn::linear(8, 16) | nn::relu() | nn::linear(16, 16) | nn::linear(16, 4));
static_assert(shard::plan_v<OddChain>.split("fc_3.weight") == 0);
static_assert(shard::plan_v<OddChain>.count(nn::Collective::all_gather) == 1);
}  // namespace

TEST_CASE("GPT-2 parameters are named as the plan says, with run-time shapes", "[plan]") {
  auto model = gpt2(64, 16, 32, 4, 2);
  auto entries = nn::param_entries(model);
  REQUIRE(entries.size() == 2 + 2 * 16 + 2);
  CHECK(entries[0].name.view() == "wte.weight");
  CHECK(entries[2].name.view() == "h.0.ln_1.weight");
  CHECK(entries[4].name.view() == "h.0.attn.q_proj.weight");
  CHECK(entries[18].name.view() == "h.1.ln_1.weight");
  CHECK(entries.back().name.view() == "ln_f.bias");
  CHECK(entries[4].shape.shape() == Shape{32, 32});
  auto split = shard::resolve(model, 2);
  for (const auto& s : split) {
    INFO(s.name);
    // every run-time entry matches the compile-time plan's entry (repeat index -> *)
    std::string pattern = s.name;
    if (pattern.rfind("h.", 0) == 0) pattern = "h.*" + pattern.substr(pattern.find('.', 2));
    CHECK(s.split_dim == gpt2_plan.split(pattern));
  }
}

namespace {
const shard::ParamSplit& entry(const std::vector<shard::ParamSplit>& plan, std::string_view name) {
  for (const auto& s : plan)
    if (s.name == name) return s;
  FAIL("no plan entry " << name);
  throw;
}
}  // namespace

TEST_CASE("grouped-query attention with 2 key/value heads stays whole over 4 shards", "[plan]") {
  const auto model =
      models::llama({.vocab = 64, .dim = 64, .layers = 1, .heads = 8, .kv_heads = 2, .hidden = 96});
  const auto two = shard::resolve(model, 2), four = shard::resolve(model, 4);
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    const std::string name = std::string("layers.0.self_attn.") + p + ".weight";
    CHECK(entry(two, name).split_dim == 0);
    CHECK(entry(four, name).split_dim == -1);
    CHECK_THAT(entry(four, name).note, Catch::Contains("whole 8-wide heads"));
  }
  CHECK(entry(four, "layers.0.self_attn.o_proj.weight").split_dim == -1);
  // The MLP is its own group: it still splits.
  CHECK(entry(four, "layers.0.mlp.gate_proj.weight").split_dim == 0);
  CHECK(entry(four, "layers.0.mlp.down_proj.weight").split_dim == 1);
  CHECK(entry(four, "embed_tokens.weight").split_dim == 0);
}

TEST_CASE("T5 with 6 heads splits its attention and bias table 2 ways but not 4", "[plan]") {
  const auto model = models::t5({.vocab = 64,
                                 .dim = 48,
                                 .heads = 6,
                                 .hidden = 64,
                                 .encoder_layers = 1,
                                 .decoder_layers = 1,
                                 .head_dim = 8});
  const auto two = shard::resolve(model, 2), four = shard::resolve(model, 4);
  const std::string q = "encoder.block.0.SelfAttention.q_proj.weight";
  const std::string table = "encoder.relative_attention_bias.weight";
  CHECK(entry(two, q).split_dim == 0);
  CHECK(entry(four, q).split_dim == -1);
  CHECK(entry(two, table).split_dim == 1);
  CHECK(entry(four, table).split_dim == -1);
}

TEST_CASE("describe prints a row per parameter with f32 bytes per shard", "[plan]") {
  const auto model = gpt2(50257, 1024, 768, 12, 1);
  const std::string text = shard::describe(shard::resolve(model, 2), 2);
  const auto line_of = [&](std::string_view name) {
    const size_t at = text.find(std::string(name) + " ");
    REQUIRE(at != std::string::npos);
    return text.substr(at, text.find('\n', at) - at);
  };
  const auto row_has = [&](std::string_view name, std::vector<std::string_view> fields) {
    std::string line = line_of(name);
    INFO(line);
    for (std::string_view f : fields) {
      const size_t at = line.find(f);
      CHECK(at != std::string::npos);
      if (at != std::string::npos) line = line.substr(at + f.size());  // fields in order
    }
  };
  CHECK(text.substr(0, text.find('\n')).find("bytes/shard (f32)") != std::string::npos);
  row_has("h.0.attn.q_proj.weight", {"[768, 768]", "attention q", "dim 0", "1179648"});
  row_has("h.0.mlp.fc2.weight", {"[768, 3072]", "row", "dim 1", "4718592"});
  row_has("h.0.mlp.fc2.bias", {"[768]", "row bias", " - ", "3072"});
  // 50257 rows do not divide by 2: the vocabulary stays whole, and the note says why.
  row_has("wte.weight", {"[50257, 768]", "vocab", " - ", "154389504"});
  CHECK(text.find("total: ") != std::string::npos);
  CHECK(text.find("note: replicated: wte.weight dim 0 = 50257 is not divisible by 2 shards") !=
        std::string::npos);
}
