// Generation for encoder-decoders (T5, flan-T5, BART) with the KV cache:
// the same tokens as transformers.generate (greedy, penalties, forced ids,
// beam search, a right-padded batch: tests/fixtures/hf/{t5,flan_t5,bart}/
// generation.json from tests/python/make_generation_goldens.py), as the
// uncached loop, alone or in any batch, on 1 or 2 model shards.
#include <catch2/catch.hpp>

#include "generation_goldens.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/generation/generate.hpp"
#include "redco/models/hf_generation.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "reference_generate.hpp"

using namespace redco;
using generation::GenerationConfig;
using Sources = std::vector<std::vector<int64_t>>;
using test::config_of;
using test::ints;

namespace {

const Sources kSources{{5, 17, 33, 40, 2}, {60, 4}, {9, 9, 41, 70, 12, 3, 88, 21}, {11}};

template <typename M>
void check_goldens(const std::string& name) {
  INFO("fixture " << name);
  const auto p = models::from_pretrained<M>(test::hf_fixture(name));
  const io::Json cases = test::generation_cases(name);
  REQUIRE(cases.size() > 0);
  for (size_t i = 0; i < cases.size(); ++i) {
    const io::Json& k = cases.at(i);
    INFO("case " << i << ": " << k.at("config").dump());
    const GenerationConfig c = config_of(k.at("config"));
    if (k.as_object().count("batch_tokens")) {  // one right-padded batch
      Sources sources;
      for (const io::Json& s : k.at("sources").as_array()) sources.push_back(ints(s));
      const auto out = generation::generate_seq2seq(p.model, p.params, sources, c);
      REQUIRE(out.sequences.size() == sources.size());
      for (size_t r = 0; r < sources.size(); ++r)
        CHECK(out.sequences[r] == ints(k.at("batch_tokens").at(r)));
      continue;
    }
    const auto out = generation::generate_seq2seq(p.model, p.params, {ints(k.at("source"))}, c);
    if (c.num_beams == 1) {
      REQUIRE(out.sequences.size() == 1);
      CHECK(out.sequences[0] == ints(k.at("tokens")));
      continue;
    }
    REQUIRE(int64_t(out.sequences.size()) == c.num_return_sequences);
    for (size_t s = 0; s < out.sequences.size(); ++s) {
      CHECK(out.sequences[s] == test::until_eos(ints(k.at("sequences").at(s)), c));
      CHECK(std::abs(out.scores[s] - float(k.at("scores").at(s).as_double())) < 1e-4f);
    }
  }
}

Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return Tensor::from<int64_t>(std::span<const int64_t>(ids), {1, int64_t(ids.size())});
}

// The uncached loop: the whole decoder sequence (from `prompt`) through the
// model each step.
template <typename M>
std::vector<int64_t> uncached_greedy(const models::Pretrained<M>& p,
                                     const std::vector<int64_t>& source,
                                     const std::vector<int64_t>& prompt, int64_t max_new) {
  const Tensor src = ids_tensor(source);
  const test::LogitsFn logits = [&](const Tensor& ids) {
    nn::Ctx ctx;
    ctx.source = src;
    return nn::apply(p.model, p.params, ids, ctx);
  };
  const std::vector<int64_t> all =
      test::generate(logits, ids_tensor(prompt), {.max_new = max_new, .greedy = true})
          .values<int64_t>();
  return {all.begin() + int64_t(prompt.size()), all.end()};
}

template <typename M>
void check_cached_and_batched(const std::string& name) {
  INFO("fixture " << name);
  const auto p = models::from_pretrained<M>(test::hf_fixture(name));
  GenerationConfig c = models::generation_config(test::hf_fixture(name));
  c.max_new_tokens = 10, c.eos_token_ids = {}, c.forced_eos_token_id = -1;
  const auto batched = generation::generate_seq2seq(p.model, p.params, kSources, c);
  GenerationConfig beams = c;
  beams.num_beams = 3, beams.num_return_sequences = 2,
  beams.eos_token_ids = {batched.sequences[0][3]};
  const auto batched_beams = generation::generate_seq2seq(p.model, p.params, kSources, beams);
  for (size_t i = 0; i < kSources.size(); ++i) {
    INFO("source " << i);
    const auto alone = generation::generate_seq2seq(p.model, p.params, {kSources[i]}, c);
    CHECK(alone.sequences[0] == batched.sequences[i]);
    CHECK(uncached_greedy(p, kSources[i], {c.decoder_start_token_id}, 10) == batched.sequences[i]);
    const auto alone_beams = generation::generate_seq2seq(p.model, p.params, {kSources[i]}, beams);
    for (size_t s = 0; s < 2; ++s) {
      CHECK(alone_beams.sequences[s] == batched_beams.sequences[2 * i + s]);
      CHECK(std::abs(alone_beams.scores[s] - batched_beams.scores[2 * i + s]) < 1e-5f);
    }
  }
}

}  // namespace

TEST_CASE("encoder-decoders: greedy, forced ids and beams equal transformers.generate",
          "[generation][seq2seq]") {
  check_goldens<models::T5>("t5");
  check_goldens<models::T5>("flan_t5");
  check_goldens<models::Bart>("bart");
}

TEST_CASE("encoder-decoders: cached equals uncached; a padded batch equals one by one",
          "[generation][seq2seq]") {
  check_cached_and_batched<models::T5>("t5");
  check_cached_and_batched<models::T5>("flan_t5");
  check_cached_and_batched<models::Bart>("bart");
}

// bf16 weights packed in decode panels (LoadOptions::decode_panels) against
// the same bf16 values row-major: T5's relative bias table and BART's
// positions and logit bias stay row-major (the plan's roles say which
// matrices a step multiplies); the encoder pass widens the panels, the
// cross-attention projections and decode steps read them.
TEST_CASE("encoder-decoders: bf16 weights in decode panels decode as row-major bf16",
          "[generation][seq2seq][bf16]") {
  auto same = [&]<typename M>(const std::string& name) {
    INFO("fixture " << name);
    const auto pp = models::from_pretrained<M>(test::hf_fixture(name),
                                               {.dtype = DType::bf16, .decode_panels = true});
    nn::ParamTree rows;
    int64_t packed = 0;
    for (const auto& [k, t] : pp.params) packed += in_panels(t), rows.emplace(k, t.to(DType::bf16));
    CHECK(packed > 0);
    GenerationConfig c = models::generation_config(test::hf_fixture(name));
    c.max_new_tokens = 8;
    const auto a = generation::generate_seq2seq(pp.model, pp.params, kSources, c);
    const auto b = generation::generate_seq2seq(pp.model, rows, kSources, c);
    CHECK(a.sequences == b.sequences);
  };
  same.operator()<models::T5>("t5");
  same.operator()<models::Bart>("bart");
}

// Decoder prompts of different lengths: each cache row's queries at their
// own positions (T5's relative position bias per row, BART's positions).
template <typename M>
void check_decoder_prompts(const std::string& name) {
  INFO("fixture " << name);
  const auto p = models::from_pretrained<M>(test::hf_fixture(name));
  GenerationConfig c = models::generation_config(test::hf_fixture(name));
  c.max_new_tokens = 8, c.eos_token_ids = {}, c.forced_eos_token_id = -1;
  const int64_t s = c.decoder_start_token_id;
  const Sources prompts{{s}, {s, 42, 77, 3}, {s, 20}, {s, 5, 6, 7, 8, 9}};
  // The sources right-padded behind their mask, as generate_seq2seq pads them.
  const int64_t Ts = 8;
  Tensor src = Tensor::full({4, Ts}, float(c.pad_token_id)).to(DType::i64);
  Tensor mask = Tensor::zeros({4, Ts});
  for (int64_t r = 0; r < 4; ++r)
    for (size_t t = 0; t < kSources[size_t(r)].size(); ++t) {
      src.data<int64_t>()[r * Ts + int64_t(t)] = kSources[size_t(r)][t];
      mask.data<float>()[r * Ts + int64_t(t)] = 1.f;
    }
  nn::Ctx ctx;
  ctx.source = src, ctx.source_mask = mask;
  const auto batched = generation::generate(p.model, p.params, prompts, c, ctx);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("row " << i);
    CHECK(uncached_greedy(p, kSources[i], prompts[i], 8) == batched.sequences[i]);
  }
}

TEST_CASE("encoder-decoders: decoder prompts of different lengths in one batch",
          "[generation][seq2seq]") {
  check_decoder_prompts<models::T5>("t5");
  check_decoder_prompts<models::T5>("flan_t5");
  check_decoder_prompts<models::Bart>("bart");
}

TEST_CASE("encoder-decoders on 2 model shards give the 1-shard tokens", "[generation][seq2seq]") {
  for (const char* name : {"t5", "flan_t5", "bart"}) {
    INFO(name);
    std::visit(
        [&](const auto& whole) {
          using M = std::decay_t<decltype(whole.model)>;
          GenerationConfig greedy = models::generation_config(test::hf_fixture(name));
          greedy.max_new_tokens = 8;
          GenerationConfig beams = greedy;
          beams.num_beams = 3;
          const auto want =
              generation::generate_seq2seq(whole.model, whole.params, kSources, greedy);
          const auto want_beams =
              generation::generate_seq2seq(whole.model, whole.params, kSources, beams);
          std::vector<generation::Generated> got(2), got_beams(2);
          comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
            const auto part = models::from_pretrained<M>(test::hf_fixture(name),
                                                         {.n_shards = 2, .rank = comm.rank()});
            nn::Ctx ctx;
            ctx.mp = &comm;
            got[size_t(comm.rank())] =
                generation::generate_seq2seq(part.model, part.params, kSources, greedy, ctx);
            got_beams[size_t(comm.rank())] =
                generation::generate_seq2seq(part.model, part.params, kSources, beams, ctx);
          });
          for (int r = 0; r < 2; ++r) {
            CHECK(got[size_t(r)].sequences == want.sequences);
            CHECK(got_beams[size_t(r)].sequences == want_beams.sequences);
          }
        },
        models::from_pretrained_any(test::hf_fixture(name)));
  }
}

TEST_CASE("encoder-decoders: cross-attention projects each source once, not once per beam",
          "[generation][seq2seq]") {
  for (const auto& fixture : {std::pair{"t5", 3}, std::pair{"bart", 2}}) {
    const char* name = fixture.first;
    const int64_t cross_layers = fixture.second;  // decoder layers
    INFO(name);
    std::visit(
        [&](const auto& p) {
          GenerationConfig c = models::generation_config(test::hf_fixture(name));
          c.max_new_tokens = 6, c.num_beams = 3, c.num_return_sequences = 2;
          int64_t projected = -1, rows = 0;
          const generation::StepFn step = [&](const Tensor& ids, nn::Ctx& ctx) {
            Tensor y = nn::apply(p.model, p.params, ids, ctx);
            projected = ctx.cache->cross_rows_projected(), rows = ctx.cache->batch();
            return y;
          };
          // (The beams' tokens against transformers': the goldens test above.)
          generation::generate_seq2seq(step, kSources, c);
          CHECK(rows == 3 * int64_t(kSources.size()));  // a cache row per beam
          CHECK(projected == cross_layers * int64_t(kSources.size()));
          // Sampled return sequences: rows per source too, projected once.
          c.num_beams = 1, c.do_sample = true, c.num_return_sequences = 4;
          generation::generate_seq2seq(step, kSources, c);
          CHECK(rows == 4 * int64_t(kSources.size()));
          CHECK(projected == cross_layers * int64_t(kSources.size()));
        },
        models::from_pretrained_any(test::hf_fixture(name)));
  }
  // Rows that change source (reorder without same_source): the memory, one
  // row per source, follows each cache row.
  nn::KVCache cache(4, 2);
  Tensor memory = Tensor::empty({2, 1, 3});
  for (int64_t i = 0; i < 6; ++i) memory.data<float>()[i] = float(i);
  nn::cache_memory(cache, memory, Tensor::ones({2, 1}));
  CHECK(cache.memory.dim(0) == 2);  // kept per source
  cache.reorder({3, 0, 2, 1});      // sources of rows: 1, 0, 1, 0
  REQUIRE(cache.memory.shape() == (Shape{4, 1, 3}));
  for (int64_t r = 0; r < 4; ++r) CHECK(cache.memory.data<float>()[r * 3] == (r % 2 ? 0.f : 3.f));
}

TEST_CASE("encoder-decoders: sampling draws a source's tokens in any batch",
          "[generation][seq2seq]") {
  const auto p = models::from_pretrained<models::Bart>(test::hf_fixture("bart"));
  GenerationConfig c = models::generation_config(test::hf_fixture("bart"));
  c.max_new_tokens = 10, c.do_sample = true, c.top_k = 20, c.seed = 3;
  const auto batched = generation::generate_seq2seq(p.model, p.params, kSources, c);
  const auto alone = generation::generate_seq2seq(p.model, p.params, {kSources[2]}, c);
  CHECK(alone.sequences[0] == batched.sequences[2]);
  // Return sequences: 3 rows per source, each source's encoder row serving its 3.
  c.num_return_sequences = 3;
  const auto three = generation::generate_seq2seq(p.model, p.params, kSources, c);
  const auto three_alone = generation::generate_seq2seq(p.model, p.params, {kSources[2]}, c);
  REQUIRE(three.sequences.size() == 3 * kSources.size());
  for (size_t i = 0; i < 3; ++i) CHECK(three.sequences[6 + i] == three_alone.sequences[i]);
  CHECK(three_alone.sequences[0] != three_alone.sequences[1]);
  // The draws follow the source (padding left out): under flat logits, where
  // only the draws pick the tokens, two sources differ and each is the same
  // alone as in the padded batch.
  const generation::StepFn flat = [](const Tensor& ids, nn::Ctx&) {
    return Tensor::zeros({ids.dim(0), 1, 96});
  };
  c.num_return_sequences = 1, c.top_k = 0, c.eos_token_ids = {}, c.forced_eos_token_id = -1;
  const auto flat_batch = generation::generate_seq2seq(flat, kSources, c);
  CHECK(flat_batch.sequences[0] != flat_batch.sequences[1]);
  for (size_t i = 0; i < kSources.size(); ++i)
    CHECK(generation::generate_seq2seq(flat, {kSources[i]}, c).sequences[0] ==
          flat_batch.sequences[i]);
}

TEST_CASE("a checkpoint's generation settings as transformers reads them",
          "[generation][seq2seq]") {
  const GenerationConfig bart = models::generation_config(test::hf_fixture("bart"));
  CHECK(bart.decoder_start_token_id == 2);
  CHECK(bart.pad_token_id == 1);
  CHECK(bart.eos_token_ids == std::vector<int64_t>{2});
  CHECK(bart.forced_eos_token_id == 2);
  CHECK(bart.forced_bos_token_id == -1);
  const GenerationConfig t5 = models::generation_config(test::hf_fixture("t5"));
  CHECK(t5.decoder_start_token_id == 0);
  CHECK(t5.pad_token_id == 0);
  CHECK(t5.eos_token_ids == std::vector<int64_t>{1});
  CHECK(t5.forced_eos_token_id == -1);
  // A folder without generation_config.json: config.json's ids.
  test::TempDir dir("gencfg");
  std::filesystem::copy_file(test::hf_fixture("bart") / "config.json", dir.path / "config.json");
  CHECK(models::generation_config(dir.path).decoder_start_token_id == 2);
}

TEST_CASE("encoder-decoder generation refuses bad input with one message",
          "[generation][seq2seq]") {
  using Catch::Matchers::Contains;
  const auto p = models::from_pretrained<models::T5>(test::hf_fixture("t5"));
  GenerationConfig c{.max_new_tokens = 4};
  CHECK_THROWS_WITH(generation::generate_seq2seq(p.model, p.params, {{5, 6}}, c),
                    Contains("decoder_start_token_id"));
  c.decoder_start_token_id = 0;
  CHECK_THROWS_WITH(generation::generate_seq2seq(p.model, p.params, {{5}, {}}, c),
                    Contains("source 1 is empty"));
  CHECK_THROWS_WITH(generation::generate_seq2seq(p.model, p.params, {}, c), Contains("no sources"));
  c.forced_bos_token_id = 500;
  CHECK_THROWS_WITH(generation::generate_seq2seq(p.model, p.params, {{5}}, c),
                    Contains("forced_bos_token_id"));
}
