// Hugging Face encoder-decoder and encoder checkpoints (T5, flan-T5, BART,
// BERT, RoBERTa): the fixtures of
// tests/fixtures/hf (tiny random models saved by the real transformers,
// tests/python/make_hf_fixtures.py) load into their typed models and give the
// reference encoder states and decoder logits, for full and padded source
// batches; under tensor parallelism each rank reads only its slices (the
// relative-bias table split by heads) and the outputs equal the 1-shard ones;
// save_pretrained writes the checkpoint's tensors back bit for bit.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "gradcheck.hpp"
#include "hf_fixtures.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/train/bound_model.hpp"
#include "redco/train/parallel.hpp"

using namespace redco;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

fs::path fixtures() { return test::hf_fixture(); }
using test::TempDir;

// What make_hf_fixtures.py's write_seq2seq records.
struct Seq2SeqGolden {
  Tensor ids, decoder_ids, mask;  // source [B, Ts], target [B, Tt], source mask [B, Ts]
  Tensor logits, encoder_hidden;  // unpadded source
  Tensor padded_logits, padded_encoder_hidden;
};
Seq2SeqGolden golden(const std::string& name) {
  const nn::ParamTree g = io::load_safetensors(fixtures() / name / "golden.safetensors");
  return {g.at("input_ids"),
          g.at("decoder_input_ids"),
          g.at("attention_mask"),
          g.at("logits"),
          g.at("encoder_hidden"),
          g.at("padded_logits"),
          g.at("padded_encoder_hidden")};
}

using test::max_abs;
using test::max_diff_unpadded;

struct Outputs {
  Tensor logits, encoder_hidden;
};

// Logits and encoder states for source `ids` (padded as `mask` says, if defined).
template <typename M>
Outputs run(const M& model, const nn::ParamTree& params, const Seq2SeqGolden& g, const Tensor& mask,
            comm::Comm* mp = nullptr) {
  NoGradGuard no_grad;
  nn::Ctx ctx;
  ctx.mp = mp;
  ctx.source = g.ids;
  ctx.source_mask = mask;
  Outputs o;
  o.encoder_hidden = nn::encode(model, params, g.ids, ctx);
  o.logits = nn::apply(model, params, g.decoder_ids, ctx);
  return o;
}

template <typename M>
std::vector<Outputs> sharded(const fs::path& dir, int n, const Seq2SeqGolden& g,
                             const Tensor& mask) {
  std::vector<Outputs> out(static_cast<size_t>(n));
  comm::ThreadsWorld(n).run([&](comm::Comm& comm) {
    const auto p = models::from_pretrained<M>(dir, {.n_shards = n, .rank = comm.rank()});
    out[size_t(comm.rank())] = run(p.model, p.params, g, mask, &comm);
  });
  return out;
}

template <typename M>
void check_seq2seq(const std::string& name, std::vector<int> shard_counts) {
  INFO("fixture " << name);
  const Seq2SeqGolden g = golden(name);
  const auto p = models::from_pretrained<M>(fixtures() / name);
  const Outputs full = run(p.model, p.params, g, Tensor());
  REQUIRE(full.logits.shape() == g.logits.shape());
  CHECK(test::max_abs_diff(full.encoder_hidden, g.encoder_hidden) <= 1e-4f);
  CHECK(test::max_abs_diff(full.logits, g.logits) <= 1e-4f);
  const Outputs padded = run(p.model, p.params, g, g.mask);
  fmt::print(
      "{}: max |diff| vs transformers: logits {:.2e}, encoder {:.2e}; padded source: {:.2e}, "
      "{:.2e}\n",
      name, test::max_abs_diff(full.logits, g.logits),
      test::max_abs_diff(full.encoder_hidden, g.encoder_hidden),
      test::max_abs_diff(padded.logits, g.padded_logits),
      max_diff_unpadded(padded.encoder_hidden, g.padded_encoder_hidden, g.mask));
  CHECK(max_diff_unpadded(padded.encoder_hidden, g.padded_encoder_hidden, g.mask) <= 1e-4f);
  CHECK(test::max_abs_diff(padded.logits, g.padded_logits) <= 1e-4f);
  CHECK(test::max_abs_diff(padded.logits, g.logits) > 1e-3f);  // the mask changed something
  for (int n : shard_counts) {
    INFO(n << " model shards");
    for (const Tensor& mask : {Tensor(), g.mask}) {
      const Outputs& one = mask.defined() ? padded : full;
      for (const Outputs& tp : sharded<M>(fixtures() / name, n, g, mask)) {
        CHECK(test::max_abs_diff(tp.logits, one.logits) <= 1e-5f * max_abs(one.logits));
        CHECK(test::max_abs_diff(tp.encoder_hidden, one.encoder_hidden) <=
              1e-5f * max_abs(one.encoder_hidden));
      }
    }
  }
}

}  // namespace

// The relative-bias tables are declared split by heads, in the type's plan.
constexpr auto kT5Plan = shard::plan_v<models::T5>;
static_assert(kT5Plan.role("encoder.relative_attention_bias.weight") == shard::Role::head_table);
static_assert(kT5Plan.split("decoder.relative_attention_bias.weight") == 1);
static_assert(kT5Plan.split("decoder.block.*.EncDecAttention.k_proj.weight") == 0);
static_assert(kT5Plan.split("decoder.block.*.DenseReluDense.wo.weight") == 1);
static_assert(kT5Plan.split("encoder.embed_tokens.weight") == 0);

TEST_CASE("T5 and flan-T5 checkpoints give transformers' encoder states and logits", "[hf][t5]") {
  check_seq2seq<models::T5>("t5", {2, 4});    // ReLU, tied head, d_kv * heads != d_model
  check_seq2seq<models::T5>("flan_t5", {2});  // gated-gelu, untied lm_head
}

namespace {

// What make_hf_fixtures.py's write_encoder records.
struct EncoderGolden {
  Tensor ids, types, padded_ids, mask, logits, hidden, padded_logits, padded_hidden;
};
EncoderGolden encoder_golden(const std::string& name) {
  const nn::ParamTree g = io::load_safetensors(fixtures() / name / "golden.safetensors");
  return {g.at("input_ids"), g.at("token_type_ids"), g.at("padded_ids"),    g.at("attention_mask"),
          g.at("logits"),    g.at("hidden"),         g.at("padded_logits"), g.at("padded_hidden")};
}

// Logits [B, labels] and the encoder's last hidden state [B, T, d]; `encoder`
// is the model's encoder alone over the same parameters.
template <typename M, typename E>
Outputs classify(const M& model, const E& encoder, const nn::ParamTree& params, const Tensor& ids,
                 const Tensor& types, const Tensor& mask, comm::Comm* mp = nullptr) {
  NoGradGuard no_grad;
  nn::Ctx ctx;
  ctx.mp = mp;
  ctx.token_types = types;
  ctx.mask = mask;
  Outputs o;
  o.encoder_hidden = nn::apply(encoder, params, ids, ctx);
  o.logits = nn::apply(model, params, ids, ctx);
  return o;
}

template <typename M, typename Encoder>
void check_encoder(const std::string& name, Encoder make_encoder, std::vector<int> shard_counts) {
  INFO("fixture " << name);
  const EncoderGolden g = encoder_golden(name);
  const auto p = models::from_pretrained<M>(fixtures() / name);
  const auto enc = make_encoder(p.config);
  const Outputs full = classify(p.model, enc, p.params, g.ids, g.types, Tensor());
  const Outputs padded = classify(p.model, enc, p.params, g.padded_ids, Tensor(), g.mask);
  fmt::print(
      "{}: max |diff| vs transformers: logits {:.2e}, hidden {:.2e}; padded: {:.2e}, {:.2e}\n",
      name, test::max_abs_diff(full.logits, g.logits),
      test::max_abs_diff(full.encoder_hidden, g.hidden),
      test::max_abs_diff(padded.logits, g.padded_logits),
      max_diff_unpadded(padded.encoder_hidden, g.padded_hidden, g.mask));
  CHECK(test::max_abs_diff(full.logits, g.logits) <= 1e-4f);
  CHECK(test::max_abs_diff(full.encoder_hidden, g.hidden) <= 1e-4f);
  // Every position, padding included: transformers' padded queries see the
  // same keys as the others, and RoBERTa numbers the pads' positions.
  CHECK(test::max_abs_diff(padded.logits, g.padded_logits) <= 1e-4f);
  CHECK(test::max_abs_diff(padded.encoder_hidden, g.padded_hidden) <= 1e-4f);
  for (int n : shard_counts) {
    INFO(n << " model shards");
    std::vector<Outputs> out(static_cast<size_t>(n));
    comm::ThreadsWorld(n).run([&](comm::Comm& comm) {
      const auto part =
          models::from_pretrained<M>(fixtures() / name, {.n_shards = n, .rank = comm.rank()});
      out[size_t(comm.rank())] = classify(part.model, make_encoder(part.config), part.params,
                                          g.padded_ids, Tensor(), g.mask, &comm);
    });
    for (const Outputs& tp : out) {
      CHECK(test::max_abs_diff(tp.logits, padded.logits) <= 1e-5f * max_abs(padded.logits));
      CHECK(test::max_abs_diff(tp.encoder_hidden, padded.encoder_hidden) <=
            1e-5f * max_abs(padded.encoder_hidden));
    }
  }
}

}  // namespace

TEST_CASE("BERT and RoBERTa classifiers give transformers' logits and hidden states",
          "[hf][bert]") {
  check_encoder<models::Bert>(
      "bert", [](const models::BertConfig& c) { return models::bert_encoder(c); }, {2, 4});
  check_encoder<models::Roberta>(
      "roberta", [](const models::BertConfig& c) { return models::roberta_encoder(c); }, {2});
  // The encoders alone, from the classifiers' folders ("bert."-prefixed
  // names) and from the BertModel-style folder save_pretrained writes.
  const EncoderGolden g = encoder_golden("bert");
  const auto enc = models::from_pretrained<models::BertEncoder>(fixtures() / "bert");
  const Tensor hidden = classify(enc.model, enc.model, enc.params, g.ids, g.types, Tensor()).logits;
  CHECK(test::max_abs_diff(hidden, g.hidden) <= 1e-4f);
  TempDir out;
  models::save_pretrained(out.path, enc);
  CHECK(io::load_safetensors(out.path / "model.safetensors").count("embeddings.LayerNorm.bias"));
  const auto back = models::from_pretrained<models::BertEncoder>(out.path);
  CHECK(back.hf_config.at("architectures").at(size_t(0)) == io::Json("BertModel"));
  for (const auto& [k, t] : enc.params) CHECK(test::max_abs_diff(back.params.at(k), t) == 0.f);
  const EncoderGolden r = encoder_golden("roberta");
  const auto renc = models::from_pretrained<models::RobertaEncoder>(fixtures() / "roberta");
  const Tensor rh =
      classify(renc.model, renc.model, renc.params, r.padded_ids, Tensor(), r.mask).logits;
  CHECK(test::max_abs_diff(rh, r.padded_hidden) <= 1e-4f);
  // As a loss or predict function runs them: token types and the mask as
  // arguments of a bound model, its context as it was afterwards.
  {
    const auto bert = models::from_pretrained<models::Bert>(fixtures() / "bert");
    NoGradGuard no_grad;
    train::BoundModel bound(bert.model, bert.params, nn::Ctx{});
    CHECK(test::max_abs_diff(models::bert_forward(bound, g.ids, g.types), g.logits) <= 1e-4f);
    CHECK(test::max_abs_diff(models::bert_forward(bound, g.padded_ids, Tensor(), g.mask),
                             g.padded_logits) <= 1e-4f);
    CHECK_FALSE(bound.ctx().token_types.defined());
    CHECK_FALSE(bound.ctx().mask.defined());
    CHECK_THROWS_WITH(models::bert_forward(bound, g.ids, g.types.slice0(0, 1)),
                      Contains("token_types"));
    CHECK_FALSE(bound.ctx().token_types.defined());  // put back after the throw too
  }
  const auto roberta = models::from_pretrained<models::Roberta>(fixtures() / "roberta");
  CHECK(roberta.config.pad == 1);
  CHECK(roberta.config.labels == 2);
  CHECK(roberta.config.types == 1);
  CHECK_THROWS_WITH(models::from_pretrained<models::Bert>(fixtures() / "roberta"),
                    Contains("'roberta' model") && Contains("models::Bert"));
}

// BART: the logit bias splits with the vocabulary, the positions stay whole.
constexpr auto kBartPlan = shard::plan_v<models::Bart>;
static_assert(kBartPlan.split("decoder.final_logits_bias") == 0);
static_assert(kBartPlan.split("encoder.embed_positions.weight") == -1);
static_assert(kBartPlan.split("decoder.layers.*.encoder_attn.o_proj.weight") == 1);
static_assert(kBartPlan.split("decoder.layers.*.final_layer_norm.weight") == -1);

TEST_CASE("BART checkpoints give transformers' encoder states and logits", "[hf][bart]") {
  // Post-LN, scaled embeddings, positions from row 2, a nonzero final_logits_bias.
  check_seq2seq<models::Bart>("bart", {2, 4});
  const auto p = models::from_pretrained<models::Bart>(fixtures() / "bart");
  CHECK(p.config.scale_embedding);
  CHECK(p.config.act == nn::Act::gelu_erf);
  CHECK(p.config.decoder_ffn == 48);
  CHECK(max_abs(p.params.at("decoder.final_logits_bias")) > 0.1f);
  CHECK(std::holds_alternative<models::Pretrained<models::Bart>>(
      models::from_pretrained_any(fixtures() / "bart")));
}

TEST_CASE("T5 config.json maps to the model's settings", "[hf][t5]") {
  const auto t5 = models::from_pretrained<models::T5>(fixtures() / "t5");
  CHECK(t5.config.head_dim == 12);
  CHECK(!t5.config.gated);
  CHECK(t5.config.act == nn::Act::relu);
  CHECK(t5.config.tie_embeddings);
  CHECK(!t5.params.count("decoder.lm_head.weight"));  // the head reads the shared embedding
  const auto flan = models::from_pretrained<models::T5>(fixtures() / "flan_t5");
  CHECK(flan.config.gated);
  CHECK(flan.config.act == nn::Act::gelu);  // gated-gelu is the tanh approximation
  CHECK(!flan.config.tie_embeddings);
  CHECK(flan.config.buckets == 16);
  CHECK(flan.config.norm_eps == Approx(1e-3f));
  CHECK(std::holds_alternative<models::Pretrained<models::T5>>(
      models::from_pretrained_any(fixtures() / "flan_t5")));
}

namespace {

template <typename M>
void check_slices(const fs::path& dir) {
  const auto whole = models::from_pretrained<M>(dir);
  const auto plan = shard::resolve(whole.model, 2);
  for (int r = 0; r < 2; ++r) {
    const auto part = models::from_pretrained<M>(dir, {.n_shards = 2, .rank = r});
    const nn::ParamTree want = train::shard_params(whole.params, plan, r, 2);
    REQUIRE(part.params.size() == want.size());
    for (const auto& [k, t] : want) {
      INFO(k);
      CHECK(test::max_abs_diff(part.params.at(k), t) == 0.f);
    }
  }
}

}  // namespace

TEST_CASE("each rank reads its slices: T5's bias table by heads, BART's logit bias by vocabulary",
          "[hf][t5][bart]") {
  check_slices<models::T5>(fixtures() / "flan_t5");
  check_slices<models::Bart>(fixtures() / "bart");
  check_slices<models::Bert>(fixtures() / "bert");
  const auto t5 = models::from_pretrained<models::T5>(fixtures() / "flan_t5", {.n_shards = 2});
  CHECK(t5.params.at("decoder.relative_attention_bias.weight").shape() == Shape{16, 2});
  const auto bart = models::from_pretrained<models::Bart>(fixtures() / "bart", {.n_shards = 2});
  CHECK(bart.params.at("decoder.final_logits_bias").shape() == Shape{48, 1});
}

TEST_CASE("save_pretrained writes T5, BART, BERT and RoBERTa checkpoints in transformers' layout",
          "[hf][t5][bart]") {
  for (const char* name : {"t5", "flan_t5", "bart", "bert", "roberta"}) {
    INFO(name);
    TempDir out;
    const auto any = models::from_pretrained_any(fixtures() / name);
    std::visit([&](const auto& p) { models::save_pretrained(out.path, p); }, any);
    const nn::ParamTree ref = io::load_safetensors(fixtures() / name / "model.safetensors");
    const nn::ParamTree mine = io::load_safetensors(out.path / "model.safetensors");
    REQUIRE(mine.size() == ref.size());
    for (const auto& [k, t] : ref) {
      INFO(k);
      REQUIRE(mine.count(k));
      CHECK(test::max_abs_diff(mine.at(k), t) == 0.f);
    }
    std::visit(
        [&](const auto& p) {
          using M = std::decay_t<decltype(p.model)>;
          const auto back = models::from_pretrained<M>(out.path);
          CHECK(back.hf_config.at("model_type") == p.hf_config.at("model_type"));
          for (const auto& [k, t] : p.params)
            CHECK(test::max_abs_diff(back.params.at(k), t) == 0.f);
        },
        any);
  }
  const auto flan = models::from_pretrained<models::T5>(fixtures() / "flan_t5");
  TempDir out;
  models::save_pretrained(out.path, flan);
  const auto back = models::from_pretrained<models::T5>(out.path);
  CHECK(back.config.gated);
  CHECK(back.config.act == nn::Act::gelu);
  CHECK(!back.config.tie_embeddings);
}

TEST_CASE("t5_shift_right starts the decoder at decoder_start and pads ignored labels", "[t5]") {
  const std::vector<int64_t> v{5, 6, -100, 7, 8, 9};
  const Tensor labels = Tensor::from<int64_t>(v, Shape{2, 3});
  const Tensor in = models::t5_shift_right(labels, 0, 0);
  CHECK(in.values<int64_t>() == std::vector<int64_t>{0, 5, 6, 0, 7, 8});
}

namespace {

void edit_config(const fs::path& dir, const std::string& from, const std::string& to) {
  std::ifstream in(dir / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << text;
}

}  // namespace

TEST_CASE("bad T5 folders fail with one message naming the culprit", "[hf][t5][errors]") {
  TempDir t;
  const fs::path d = t.path / "m";
  auto fresh = [&] {
    fs::remove_all(d);
    fs::copy(fixtures() / "t5", d, fs::copy_options::recursive);
  };
  fresh();
  CHECK_THROWS_WITH(models::from_pretrained<models::Llama>(d),
                    Contains("'t5' model") && Contains("models::Llama"));
  edit_config(d, "\"feed_forward_proj\": \"relu\"", "\"feed_forward_proj\": \"gated-gelu-x\"");
  CHECK_THROWS_WITH(models::from_pretrained<models::T5>(d),
                    Contains("feed_forward_proj") && Contains("gated-gelu-x"));
  fresh();
  edit_config(d, "\"feed_forward_proj\": \"relu\"", "\"feed_forward_proj\": \"mish\"");
  CHECK_THROWS_WITH(models::from_pretrained<models::T5>(d),
                    Contains("feed_forward_proj") && Contains("mish"));
  fresh();
  edit_config(d, "\"d_kv\": 12", "\"d_kv\": 8");
  CHECK_THROWS_WITH(models::from_pretrained<models::T5>(d),
                    Contains("SelfAttention.q.weight") && Contains("has shape"));
  fresh();
  edit_config(d, "\"relative_attention_num_buckets\": 8", "\"relative_attention_num_buckets\": 16");
  CHECK_THROWS_WITH(models::from_pretrained<models::T5>(d),
                    Contains("relative_attention_bias.weight") && Contains("has shape"));
}

TEST_CASE("an untied T5 folder without lm_head.weight names the missing tensor",
          "[hf][t5][errors]") {
  TempDir t;
  const fs::path d = t.path / "m";
  fs::copy(fixtures() / "t5", d, fs::copy_options::recursive);
  edit_config(d, "\"vocab_size\": 96", "\"vocab_size\": 96, \"tie_word_embeddings\": false");
  CHECK_THROWS_WITH(models::from_pretrained<models::T5>(d),
                    Contains("lm_head.weight") && Contains("missing"));
}

TEST_CASE("bad BART and BERT folders fail with one message naming the culprit",
          "[hf][bart][bert][errors]") {
  TempDir t;
  const fs::path d = t.path / "m";
  auto fresh = [&](const char* name) {
    fs::remove_all(d);
    fs::copy(fixtures() / name, d, fs::copy_options::recursive);
  };
  fresh("bart");
  edit_config(d, "\"decoder_attention_heads\": 4", "\"decoder_attention_heads\": 5");
  CHECK_THROWS_WITH(models::from_pretrained<models::Bart>(d),
                    Contains("decoder_attention_heads") && Contains("must divide d_model = 32"));
  fresh("bart");
  edit_config(d, "\"max_position_embeddings\": 24", "\"max_position_embeddings\": 30");
  CHECK_THROWS_WITH(models::from_pretrained<models::Bart>(d),
                    Contains("embed_positions.weight") && Contains("has shape"));
  fresh("bert");
  edit_config(d, "\"position_embedding_type\": \"absolute\"",
              "\"position_embedding_type\": \"relative_key\"");
  CHECK_THROWS_WITH(models::from_pretrained<models::Bert>(d), Contains("position_embedding_type"));
  fresh("roberta");
  CHECK_THROWS_WITH(models::from_pretrained<models::BertEncoder>(d),
                    Contains("'roberta' model") && Contains("models::BertEncoder"));
}
