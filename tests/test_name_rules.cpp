// Name-based tensor-parallel rules on real Hugging Face parameter names and shapes,
// listed in each checkpoint's own order (the modules' registration order).
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/shard/name_rules.hpp"

using redco::Shape;
using redco::shard::Conv1d;
using redco::shard::IndexRange;
using redco::shard::NamedShape;
using redco::shard::NameRuleOptions;
using redco::shard::ParamSplit;
using redco::shard::plan_by_names;
using redco::shard::Role;

namespace {

using enum redco::shard::Role;
constexpr int R = -1;  // replicated

struct Expect {
  std::string name;
  Shape shape;
  Role role;
  int split2;  // split dim of the stored tensor with 2 shards
  int split4;  // ... with 4 shards
};

std::vector<NamedShape> names_of(const std::vector<Expect>& model) {
  std::vector<NamedShape> params;
  for (const Expect& e : model) params.push_back({e.name, e.shape});
  return params;
}

const ParamSplit& entry(const std::vector<ParamSplit>& plan, std::string_view name) {
  const auto it = std::find_if(plan.begin(), plan.end(), [&](auto& p) { return p.name == name; });
  REQUIRE(it != plan.end());
  return *it;
}

void check_model(const std::vector<Expect>& model, const NameRuleOptions& opts) {
  const std::vector<NamedShape> params = names_of(model);
  for (int n : {2, 4}) {
    const std::vector<ParamSplit> plan = plan_by_names(params, n, opts);
    REQUIRE(plan.size() == model.size());
    for (size_t i = 0; i < model.size(); ++i) {
      INFO(n << " shards: " << model[i].name << " note: " << plan[i].note);
      CHECK(plan[i].name == model[i].name);
      CHECK(plan[i].shape == model[i].shape);
      CHECK(role_name(plan[i].role) == role_name(model[i].role));
      CHECK(plan[i].split_dim == (n == 2 ? model[i].split2 : model[i].split4));
    }
  }
}

bool contains(const std::string& s, std::string_view sub) {
  return s.find(sub) != std::string::npos;
}

// GPT-2 (124M) as GPT2LMHeadModel saves it; its Conv1D weights are stored (in, out).
const std::vector<Expect> kGpt2 = {
    {"transformer.wte.weight", {50257, 768}, vocab, R, R},  // 50257 is odd
    {"transformer.wpe.weight", {1024, 768}, replicated, R, R},
    {"transformer.h.0.ln_1.weight", {768}, replicated, R, R},
    {"transformer.h.0.ln_1.bias", {768}, replicated, R, R},
    {"transformer.h.0.attn.bias", {1, 1, 1024, 1024}, replicated, R, R},  // causal mask buffer
    {"transformer.h.0.attn.masked_bias", {}, replicated, R, R},
    {"transformer.h.0.attn.c_attn.weight", {768, 2304}, attn_q, 1, 1},  // fused q|k|v outputs
    {"transformer.h.0.attn.c_attn.bias", {2304}, column_bias, 0, 0},
    {"transformer.h.0.attn.c_proj.weight", {768, 768}, attn_o, 0, 0},  // (in, out): dim 0
    {"transformer.h.0.attn.c_proj.bias", {768}, row_bias, R, R},
    {"transformer.h.0.ln_2.weight", {768}, replicated, R, R},
    {"transformer.h.0.ln_2.bias", {768}, replicated, R, R},
    {"transformer.h.0.mlp.c_fc.weight", {768, 3072}, column, 1, 1},
    {"transformer.h.0.mlp.c_fc.bias", {3072}, column_bias, 0, 0},
    {"transformer.h.0.mlp.c_proj.weight", {3072, 768}, row, 0, 0},
    {"transformer.h.0.mlp.c_proj.bias", {768}, row_bias, R, R},
    {"transformer.ln_f.weight", {768}, replicated, R, R},
    {"transformer.ln_f.bias", {768}, replicated, R, R},
};

TEST_CASE("GPT-2: Conv1D (in, out) weights flip the split dim", "[shard]") {
  check_model(kGpt2, {.num_heads = 12});

  const auto plan = plan_by_names(names_of(kGpt2), 2, {.num_heads = 12});
  const ParamSplit& wte = entry(plan, "transformer.wte.weight");
  CHECK(contains(wte.note, "transformer.wte.weight"));
  CHECK(contains(wte.note, "[50257, 768]"));
  CHECK(contains(wte.note, "2 shards"));

  // The fused q|k|v is split per block: each shard gets the q, k and v of the same heads.
  const ParamSplit& qkv = entry(plan, "transformer.h.0.attn.c_attn.weight");
  CHECK(qkv.in_out);
  CHECK(qkv.fused_blocks == 3);
  CHECK(redco::shard::shard_shape(qkv, 2) == Shape{768, 1152});
  CHECK(redco::shard::shard_ranges(qkv, 2, 1) ==
        std::vector<IndexRange>{{384, 768}, {1152, 1536}, {1920, 2304}});
  const ParamSplit& qkv_bias = entry(plan, "transformer.h.0.attn.c_attn.bias");
  CHECK(qkv_bias.fused_blocks == 3);
  CHECK(redco::shard::shard_ranges(qkv_bias, 2, 0) ==
        std::vector<IndexRange>{{0, 384}, {768, 1152}, {1536, 1920}});
  CHECK(redco::shard::shard_ranges(entry(plan, "transformer.h.0.mlp.c_fc.weight"), 2, 1) ==
        std::vector<IndexRange>{{1536, 3072}});
  CHECK(redco::shard::shard_ranges(wte, 2, 0).empty());
  CHECK(redco::shard::shard_shape(entry(plan, "transformer.h.0.attn.c_proj.weight"), 2) ==
        Shape{384, 768});
}

TEST_CASE("GPT-2: 12 heads of 64 do not split 8 ways, the MLP still does", "[shard]") {
  const auto plan = plan_by_names(names_of(kGpt2), 8, {.num_heads = 12});
  const ParamSplit& qkv = entry(plan, "transformer.h.0.attn.c_attn.weight");
  CHECK(qkv.split_dim == R);
  CHECK(contains(qkv.note, "[768, 2304]"));
  CHECK(contains(qkv.note, "whole heads of 64"));
  // O's input features are the same 768 = 12 heads of 64.
  const ParamSplit& o = entry(plan, "transformer.h.0.attn.c_proj.weight");
  CHECK(o.split_dim == R);
  CHECK(contains(o.note, "transformer.h.0.attn.c_proj.weight [768, 768]: dim 0 of size 768"));
  CHECK(entry(plan, "transformer.h.0.attn.c_attn.bias").split_dim == R);
  CHECK(entry(plan, "transformer.h.0.mlp.c_fc.weight").split_dim == 1);
  CHECK(entry(plan, "transformer.h.0.mlp.c_proj.weight").split_dim == 0);
}

TEST_CASE("Conv1d::never and ::always choose the stored layout", "[shard]") {
  const auto plain = plan_by_names(names_of(kGpt2), 2, {.conv1d = Conv1d::never});
  CHECK(entry(plain, "transformer.h.0.mlp.c_fc.weight").split_dim == 0);
  CHECK_FALSE(entry(plain, "transformer.h.0.mlp.c_fc.weight").in_out);
  const std::vector<NamedShape> llama_t = {
      {"model.layers.0.mlp.up_proj.weight", {64, 128}},
      {"model.layers.0.mlp.down_proj.weight", {128, 64}},
  };
  const auto flipped = plan_by_names(llama_t, 2, {.conv1d = Conv1d::always});
  CHECK(flipped[0].split_dim == 1);
  CHECK(flipped[1].split_dim == 0);
}

// LLaMA-7B's layout at small sizes: hidden 512, 8 heads of 64, intermediate 1376.
const std::vector<Expect> kLlama = {
    {"model.embed_tokens.weight", {32000, 512}, vocab, 0, 0},
    {"model.layers.0.self_attn.q_proj.weight", {512, 512}, attn_q, 0, 0},
    {"model.layers.0.self_attn.k_proj.weight", {512, 512}, attn_k, 0, 0},
    {"model.layers.0.self_attn.v_proj.weight", {512, 512}, attn_v, 0, 0},
    {"model.layers.0.self_attn.o_proj.weight", {512, 512}, attn_o, 1, 1},
    {"model.layers.0.mlp.gate_proj.weight", {1376, 512}, column, 0, 0},
    {"model.layers.0.mlp.up_proj.weight", {1376, 512}, column, 0, 0},
    {"model.layers.0.mlp.down_proj.weight", {512, 1376}, row, 1, 1},
    {"model.layers.0.input_layernorm.weight", {512}, replicated, R, R},
    {"model.layers.0.post_attention_layernorm.weight", {512}, replicated, R, R},
    {"model.norm.weight", {512}, replicated, R, R},
    {"lm_head.weight", {32000, 512}, vocab, 0, 0},
};

TEST_CASE("LLaMA: q/k/v/o by heads, gate/up column, down row, vocab split", "[shard]") {
  check_model(kLlama, {.num_heads = 8});
  check_model(kLlama, {.head_dim = 64});
}

TEST_CASE("LLaMA with grouped-query attention: 2 key/value heads do not split 4 ways", "[shard]") {
  std::vector<Expect> gqa = kLlama;
  gqa[2].shape = {128, 512};                               // k_proj: 2 kv heads of 64
  gqa[3].shape = {128, 512};                               // v_proj
  for (int i = 1; i <= 4; ++i) gqa[size_t(i)].split4 = R;  // the whole attention stays whole
  check_model(gqa, {.num_heads = 8});
  const auto plan = plan_by_names(names_of(gqa), 4, {.num_heads = 8});
  CHECK(contains(plan[2].note, "model.layers.0.self_attn.k_proj.weight [128, 512]"));
  CHECK(contains(plan[1].note, "k_proj"));  // q names the partner that blocks it
}

// Meta's original LLaMA checkpoint lists w1, w2, w3; execution order is w1, w3, w2, so
// alternating by position would make w2 column and w3 row. The names decide instead.
TEST_CASE("LLaMA in Meta's consolidated layout", "[shard]") {
  check_model({{"tok_embeddings.weight", {32000, 512}, vocab, 0, 0},
               {"norm.weight", {512}, replicated, R, R},
               {"output.weight", {32000, 512}, vocab, 0, 0},
               {"layers.0.attention.wq.weight", {512, 512}, attn_q, 0, 0},
               {"layers.0.attention.wk.weight", {512, 512}, attn_k, 0, 0},
               {"layers.0.attention.wv.weight", {512, 512}, attn_v, 0, 0},
               {"layers.0.attention.wo.weight", {512, 512}, attn_o, 1, 1},
               {"layers.0.feed_forward.w1.weight", {1376, 512}, column, 0, 0},
               {"layers.0.feed_forward.w2.weight", {512, 1376}, row, 1, 1},
               {"layers.0.feed_forward.w3.weight", {1376, 512}, column, 0, 0},
               {"layers.0.attention_norm.weight", {512}, replicated, R, R},
               {"layers.0.ffn_norm.weight", {512}, replicated, R, R},
               {"rope.freqs", {32}, replicated, R, R}},
              {.num_heads = 8});
}

TEST_CASE("OPT-125m: k/v/q/out_proj with biases, fc1/fc2", "[shard]") {
  const std::string l = "model.decoder.layers.0.";
  const std::vector<Expect> opt = {
      {"model.decoder.embed_tokens.weight", {50272, 768}, vocab, 0, 0},
      {"model.decoder.embed_positions.weight", {2050, 768}, replicated, R, R},
      {"model.decoder.final_layer_norm.weight", {768}, replicated, R, R},
      {"model.decoder.final_layer_norm.bias", {768}, replicated, R, R},
      {l + "self_attn.k_proj.weight", {768, 768}, attn_k, 0, 0},
      {l + "self_attn.k_proj.bias", {768}, column_bias, 0, 0},
      {l + "self_attn.v_proj.weight", {768, 768}, attn_v, 0, 0},
      {l + "self_attn.v_proj.bias", {768}, column_bias, 0, 0},
      {l + "self_attn.q_proj.weight", {768, 768}, attn_q, 0, 0},
      {l + "self_attn.q_proj.bias", {768}, column_bias, 0, 0},
      {l + "self_attn.out_proj.weight", {768, 768}, attn_o, 1, 1},
      {l + "self_attn.out_proj.bias", {768}, row_bias, R, R},
      {l + "self_attn_layer_norm.weight", {768}, replicated, R, R},
      {l + "self_attn_layer_norm.bias", {768}, replicated, R, R},
      {l + "fc1.weight", {3072, 768}, column, 0, 0},
      {l + "fc1.bias", {3072}, column_bias, 0, 0},
      {l + "fc2.weight", {768, 3072}, row, 1, 1},
      {l + "fc2.bias", {768}, row_bias, R, R},
      {l + "final_layer_norm.weight", {768}, replicated, R, R},
      {l + "final_layer_norm.bias", {768}, replicated, R, R},
      {"lm_head.weight", {50272, 768}, vocab, 0, 0},
  };
  check_model(opt, {.num_heads = 12});
}

TEST_CASE("GPT-J-6B: attn buffers, fc_in/fc_out, an LM head with a bias", "[shard]") {
  check_model(
      {
          {"transformer.wte.weight", {50400, 4096}, vocab, 0, 0},
          {"transformer.h.0.ln_1.weight", {4096}, replicated, R, R},
          {"transformer.h.0.ln_1.bias", {4096}, replicated, R, R},
          {"transformer.h.0.attn.bias", {1, 1, 2048, 2048}, replicated, R, R},
          {"transformer.h.0.attn.masked_bias", {}, replicated, R, R},
          {"transformer.h.0.attn.k_proj.weight", {4096, 4096}, attn_k, 0, 0},
          {"transformer.h.0.attn.v_proj.weight", {4096, 4096}, attn_v, 0, 0},
          {"transformer.h.0.attn.q_proj.weight", {4096, 4096}, attn_q, 0, 0},
          {"transformer.h.0.attn.out_proj.weight", {4096, 4096}, attn_o, 1, 1},
          {"transformer.h.0.mlp.fc_in.weight", {16384, 4096}, column, 0, 0},
          {"transformer.h.0.mlp.fc_in.bias", {16384}, column_bias, 0, 0},
          {"transformer.h.0.mlp.fc_out.weight", {4096, 16384}, row, 1, 1},
          {"transformer.h.0.mlp.fc_out.bias", {4096}, row_bias, R, R},
          {"transformer.ln_f.weight", {4096}, replicated, R, R},
          {"transformer.ln_f.bias", {4096}, replicated, R, R},
          {"lm_head.weight", {50400, 4096}, vocab, 0, 0},
          {"lm_head.bias", {50400}, column_bias, 0, 0},  // split with the vocabulary
      },
      {.num_heads = 16});
}

TEST_CASE("T5-small: SelfAttention/EncDecAttention q/k/v/o, DenseReluDense wi/wo", "[shard]") {
  std::vector<Expect> t5 = {{"shared.weight", {32128, 512}, vocab, 0, 0},
                            {"encoder.embed_tokens.weight", {32128, 512}, vocab, 0, 0}};
  const auto attention = [&](const std::string& prefix, bool relative) {
    t5.push_back({prefix + "q.weight", {512, 512}, attn_q, 0, 0});
    t5.push_back({prefix + "k.weight", {512, 512}, attn_k, 0, 0});
    t5.push_back({prefix + "v.weight", {512, 512}, attn_v, 0, 0});
    t5.push_back({prefix + "o.weight", {512, 512}, attn_o, 1, 1});
    if (relative)
      t5.push_back({prefix + "relative_attention_bias.weight", {32, 8}, replicated, R, R});
  };
  const auto norm = [&](const char* name) { t5.push_back({name, {512}, replicated, R, R}); };
  attention("encoder.block.0.layer.0.SelfAttention.", true);
  norm("encoder.block.0.layer.0.layer_norm.weight");
  t5.push_back({"encoder.block.0.layer.1.DenseReluDense.wi.weight", {2048, 512}, column, 0, 0});
  t5.push_back({"encoder.block.0.layer.1.DenseReluDense.wo.weight", {512, 2048}, row, 1, 1});
  norm("encoder.block.0.layer.1.layer_norm.weight");
  norm("encoder.final_layer_norm.weight");
  t5.push_back({"decoder.embed_tokens.weight", {32128, 512}, vocab, 0, 0});
  attention("decoder.block.0.layer.0.SelfAttention.", true);
  norm("decoder.block.0.layer.0.layer_norm.weight");
  attention("decoder.block.0.layer.1.EncDecAttention.", false);
  norm("decoder.block.0.layer.1.layer_norm.weight");
  t5.push_back({"decoder.block.0.layer.2.DenseReluDense.wi.weight", {2048, 512}, column, 0, 0});
  t5.push_back({"decoder.block.0.layer.2.DenseReluDense.wo.weight", {512, 2048}, row, 1, 1});
  norm("decoder.block.0.layer.2.layer_norm.weight");
  norm("decoder.final_layer_norm.weight");
  t5.push_back({"lm_head.weight", {32128, 512}, vocab, 0, 0});
  check_model(t5, {.head_dim = 64});
}

// flan-t5-small: 6 heads of 64 (inner width 384 != d_model 512), gated wi_0/wi_1.
TEST_CASE("flan-T5-small: 6 heads split 2 ways but not 4", "[shard]") {
  const std::vector<Expect> flan = {
      {"encoder.block.0.layer.0.SelfAttention.q.weight", {384, 512}, attn_q, 0, R},
      {"encoder.block.0.layer.0.SelfAttention.k.weight", {384, 512}, attn_k, 0, R},
      {"encoder.block.0.layer.0.SelfAttention.v.weight", {384, 512}, attn_v, 0, R},
      {"encoder.block.0.layer.0.SelfAttention.o.weight", {512, 384}, attn_o, 1, R},
      {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
       {32, 6},
       replicated,
       R,
       R},
      {"encoder.block.0.layer.0.layer_norm.weight", {512}, replicated, R, R},
      {"encoder.block.0.layer.1.DenseReluDense.wi_0.weight", {1024, 512}, column, 0, 0},
      {"encoder.block.0.layer.1.DenseReluDense.wi_1.weight", {1024, 512}, column, 0, 0},
      {"encoder.block.0.layer.1.DenseReluDense.wo.weight", {512, 1024}, row, 1, 1},
      {"encoder.block.0.layer.1.layer_norm.weight", {512}, replicated, R, R},
  };
  check_model(flan, {.num_heads = 6});
  const auto plan = plan_by_names(names_of(flan), 4, {.num_heads = 6});
  CHECK(contains(plan[0].note, "encoder.block.0.layer.0.SelfAttention.q.weight [384, 512]"));
  CHECK(contains(plan[0].note, "4 shards x whole heads of 64"));
}

// bert-base-uncased as BertForSequenceClassification saves it.
const std::vector<Expect> kBert = {
    {"bert.embeddings.word_embeddings.weight", {30522, 768}, vocab, 0, R},  // 30522 = 2 x 15261
    {"bert.embeddings.position_embeddings.weight", {512, 768}, replicated, R, R},
    {"bert.embeddings.token_type_embeddings.weight", {2, 768}, replicated, R, R},
    {"bert.embeddings.LayerNorm.weight", {768}, replicated, R, R},
    {"bert.embeddings.LayerNorm.bias", {768}, replicated, R, R},
    {"bert.encoder.layer.0.attention.self.query.weight", {768, 768}, attn_q, 0, 0},
    {"bert.encoder.layer.0.attention.self.query.bias", {768}, column_bias, 0, 0},
    {"bert.encoder.layer.0.attention.self.key.weight", {768, 768}, attn_k, 0, 0},
    {"bert.encoder.layer.0.attention.self.key.bias", {768}, column_bias, 0, 0},
    {"bert.encoder.layer.0.attention.self.value.weight", {768, 768}, attn_v, 0, 0},
    {"bert.encoder.layer.0.attention.self.value.bias", {768}, column_bias, 0, 0},
    {"bert.encoder.layer.0.attention.output.dense.weight", {768, 768}, attn_o, 1, 1},
    {"bert.encoder.layer.0.attention.output.dense.bias", {768}, row_bias, R, R},
    {"bert.encoder.layer.0.attention.output.LayerNorm.weight", {768}, replicated, R, R},
    {"bert.encoder.layer.0.attention.output.LayerNorm.bias", {768}, replicated, R, R},
    {"bert.encoder.layer.0.intermediate.dense.weight", {3072, 768}, column, 0, 0},
    {"bert.encoder.layer.0.intermediate.dense.bias", {3072}, column_bias, 0, 0},
    {"bert.encoder.layer.0.output.dense.weight", {768, 3072}, row, 1, 1},
    {"bert.encoder.layer.0.output.dense.bias", {768}, row_bias, R, R},
    {"bert.encoder.layer.0.output.LayerNorm.weight", {768}, replicated, R, R},
    {"bert.encoder.layer.0.output.LayerNorm.bias", {768}, replicated, R, R},
    // Outside any numbered layer: no order to alternate by, and tiny; kept whole.
    {"bert.pooler.dense.weight", {768, 768}, replicated, R, R},
    {"bert.pooler.dense.bias", {768}, replicated, R, R},
    {"classifier.weight", {2, 768}, replicated, R, R},
    {"classifier.bias", {2}, replicated, R, R},
};

TEST_CASE("BERT: attention.output.dense is O, output.dense is the MLP's row layer", "[shard]") {
  check_model(kBert, {.num_heads = 12});
  const auto plan = plan_by_names(names_of(kBert), 4, {.num_heads = 12});
  const ParamSplit& words = entry(plan, "bert.embeddings.word_embeddings.weight");
  CHECK(contains(words.note, "[30522, 768]"));
  CHECK(contains(words.note, "4 shards"));
  CHECK(contains(entry(plan, "bert.pooler.dense.weight").note, "outside any numbered layer"));
}

// RedCoast sorted the names and alternated by sorted position. Sorted, layer 0's linears are
//   attention.output.dense  -> column  (wrong: it is O, row-parallel)
//   attention.self.key      -> row     (wrong: K is column-parallel)
//   attention.self.query    -> column
//   attention.self.value    -> row     (wrong)
//   intermediate.dense      -> column
//   output.dense            -> row
// Names decide here, so the sorted list gets exactly the plan of the given order.
TEST_CASE("BERT: sorting the names does not change the plan", "[shard]") {
  std::vector<NamedShape> sorted = names_of(kBert);
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.name < b.name; });
  const auto at = [&](std::string_view name) {
    return std::find_if(sorted.begin(), sorted.end(), [&](auto& p) { return p.name == name; });
  };
  REQUIRE(at("bert.encoder.layer.0.attention.output.dense.weight") <
          at("bert.encoder.layer.0.attention.self.key.weight"));
  for (int n : {2, 4}) {
    const auto given = plan_by_names(names_of(kBert), n, {.num_heads = 12});
    const auto plan = plan_by_names(sorted, n, {.num_heads = 12});
    for (const ParamSplit& p : plan) {
      INFO(p.name);
      CHECK(p.role == entry(given, p.name).role);
      CHECK(p.split_dim == entry(given, p.name).split_dim);
    }
  }
  const auto plan = plan_by_names(sorted, 2, {.num_heads = 12});
  CHECK(entry(plan, "bert.encoder.layer.0.attention.output.dense.weight").role == attn_o);
  CHECK(entry(plan, "bert.encoder.layer.0.attention.self.key.weight").role == attn_k);
}

TEST_CASE("Without head counts attention splits by divisibility, with a caveat", "[shard]") {
  const auto guessed = plan_by_names(names_of(kBert), 8);
  const ParamSplit& q = entry(guessed, "bert.encoder.layer.0.attention.self.query.weight");
  CHECK(q.split_dim == 0);
  CHECK(contains(q.note, "head size unknown"));
  // 12 heads of 64 cannot be dealt out whole to 8 shards.
  const auto known = plan_by_names(names_of(kBert), 8, {.num_heads = 12});
  const ParamSplit& kq = entry(known, "bert.encoder.layer.0.attention.self.query.weight");
  CHECK(kq.split_dim == R);
  CHECK(contains(kq.note, "[768, 768]"));
  CHECK(contains(kq.note, "whole heads of 64"));
  CHECK(entry(known, "bert.encoder.layer.0.attention.self.query.bias").split_dim == R);
  CHECK(entry(known, "bert.encoder.layer.0.intermediate.dense.weight").split_dim == 0);
}

// DistilBERT's ffn.lin1/lin2 match no pattern: they alternate in the given order.
TEST_CASE("Unrecognised linears alternate column, row within their layer", "[shard]") {
  const std::string l = "distilbert.transformer.layer.0.";
  check_model({{l + "attention.q_lin.weight", {768, 768}, attn_q, 0, 0},
               {l + "attention.k_lin.weight", {768, 768}, attn_k, 0, 0},
               {l + "attention.v_lin.weight", {768, 768}, attn_v, 0, 0},
               {l + "attention.out_lin.weight", {768, 768}, attn_o, 1, 1},
               {l + "sa_layer_norm.weight", {768}, replicated, R, R},
               {l + "ffn.lin1.weight", {3072, 768}, column, 0, 0},
               {l + "ffn.lin1.bias", {3072}, column_bias, 0, 0},
               {l + "ffn.lin2.weight", {768, 3072}, row, 1, 1},
               {l + "ffn.lin2.bias", {768}, row_bias, R, R}},
              {.num_heads = 12});
}

TEST_CASE("A fallback run without a row partner, or not divisible, stays whole", "[shard]") {
  const std::vector<NamedShape> params = {
      {"blocks.0.mix.a.weight", {64, 32}}, {"blocks.0.mix.b.weight", {32, 64}},
      {"blocks.0.mix.c.weight", {64, 32}}, {"blocks.1.mix.a.weight", {6, 32}},
      {"blocks.1.mix.b.weight", {32, 6}},
  };
  const auto plan = plan_by_names(params, 4);
  CHECK(plan[0].role == column);
  CHECK(plan[0].split_dim == 0);
  CHECK(plan[1].role == row);
  CHECK(plan[1].split_dim == 1);
  CHECK(plan[2].role == column);  // a second run that nothing consumes
  CHECK(plan[2].split_dim == R);
  CHECK(contains(plan[2].note, "no row-parallel partner"));
  CHECK(contains(plan[2].note, "'blocks.0'"));
  CHECK(plan[3].split_dim == R);  // 6 outputs over 4 shards
  CHECK(contains(plan[3].note, "blocks.1.mix.a.weight [6, 32]: dim 0 of size 6"));
  CHECK(plan[4].split_dim == R);  // its 6 inputs do not divide either
  CHECK(contains(plan[4].note, "blocks.1.mix.b.weight [32, 6]: dim 1 of size 6"));
  CHECK(plan_by_names(params, 2)[3].split_dim == 0);
}

TEST_CASE("plan_by_names rejects bad input", "[shard]") {
  const std::vector<NamedShape> twice = {{"a.weight", {4, 4}}, {"a.weight", {4, 4}}};
  CHECK_THROWS_AS(plan_by_names(twice, 2), redco::Error);
  CHECK_THROWS_AS(plan_by_names(names_of(kLlama), 0), redco::Error);
  CHECK_THROWS_WITH(plan_by_names(names_of(kLlama), 2, {.num_heads = 7}),
                    Catch::Contains("num_heads 7 does not divide the query width 512"));
  const auto one = plan_by_names(names_of(kLlama), 1, {.num_heads = 8});
  CHECK(redco::shard::shard_shape(one[5], 1) == Shape{1376, 512});
}

std::string line_of(const std::string& text, std::string_view name) {
  const size_t at = text.find(std::string(name) + " ");
  REQUIRE(at != std::string::npos);
  return text.substr(at, text.find('\n', at) - at);
}

TEST_CASE("describe prints a row per parameter with f32 bytes per shard", "[shard]") {
  const auto plan = plan_by_names(names_of(kGpt2), 2, {.num_heads = 12});
  const std::string text = redco::shard::describe(plan, 2);
  const std::string header = text.substr(0, text.find('\n'));
  CHECK(contains(header, "parameter"));
  CHECK(contains(header, "bytes/shard (f32)"));
  const auto row_has = [&](std::string_view name, std::vector<std::string_view> fields) {
    std::string line = line_of(text, name);
    INFO(line);
    for (std::string_view f : fields) {
      const size_t at = line.find(f);
      CHECK(at != std::string::npos);
      if (at != std::string::npos) line = line.substr(at + f.size());  // fields in order
    }
  };
  row_has("transformer.h.0.attn.c_attn.weight",
          {"[768, 2304]", "attention q", "dim 1 (3 blocks)", "3538944"});  // 768*1152*4
  row_has("transformer.wte.weight", {"[50257, 768]", "vocab", " - ", "154389504"});
  row_has("transformer.h.0.mlp.c_proj.weight", {"[3072, 768]", "row", "dim 0", "4718592"});
  row_has("transformer.h.0.mlp.c_proj.bias", {"[768]", "row bias", " - ", "3072"});
  CHECK(contains(text, "total: "));
  CHECK(contains(text, "note: transformer.wte.weight [50257, 768]: vocabulary of 50257"));
}

}  // namespace
