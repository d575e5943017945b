// data::Seq2SeqEncoder (labels, shifted decoder input, padding, truncation,
// decoding) and train::seq2seq_logits / seq2seq_generate on a small T5: a
// padded batch gives each row what the row gives alone.
#include <catch2/catch.hpp>

#include "redco/data/bpe.hpp"
#include "redco/data/seq2seq_batch.hpp"
#include "redco/models/t5.hpp"
#include "redco/train/seq2seq.hpp"

using namespace redco;
using Catch::Contains;

namespace {

std::vector<int64_t> row(const Tensor& t, int64_t r) {
  const int64_t T = t.shape()[1];
  const int64_t* p = t.data<int64_t>() + r * T;
  return {p, p + T};
}

data::Tokenizer small_tokenizer() {
  const std::string corpus = "the cat sat on the mat; the dog sat on the log. el gato y el perro. ";
  return data::Tokenizer::from_json(data::Bpe::train(corpus + corpus, 300).to_tokenizer_json());
}

std::vector<int64_t> ids(const data::Tokenizer& tok, const std::string& s) {
  const data::Encoding e = tok.encode(s, false);
  return {e.ids.begin(), e.ids.end()};
}

}  // namespace

TEST_CASE("Seq2SeqEncoder::with_eos: labels, shifted decoder input, padding, decoding",
          "[seq2seq]") {
  const data::Tokenizer ref = small_tokenizer();
  const int64_t V = ref.vocab_size();
  const auto enc = data::Seq2SeqEncoder::with_eos(small_tokenizer(), 6);
  CHECK(enc.vocab_size() == (V + 2 + 63) / 64 * 64);
  CHECK(enc.pad_id() == V);
  CHECK(enc.decoder_start() == V);
  CHECK(enc.eos_id() == V + 1);
  const std::vector<std::string> src{"the cat", "the dog sat on the log. the cat sat on the mat"},
      tgt{"el gato y el perro", "el"};
  const data::Seq2SeqBatch b = enc.encode(src, tgt);
  // Sources: ids then eos, truncated to 5 + eos, right-padded behind the mask.
  std::vector<int64_t> s0 = ids(ref, "the cat"), s1 = ids(ref, src[1]);
  s0.push_back(V + 1);
  s1.resize(5);
  s1.push_back(V + 1);
  REQUIRE(b.source.shape() == (Shape{2, 6}));
  std::vector<int64_t> want0 = s0, mask0(6, 0);
  want0.resize(6, V);
  std::fill_n(mask0.begin(), s0.size(), 1);
  CHECK(row(b.source, 0) == want0);
  CHECK(row(b.source, 1) == s1);
  CHECK(row(b.source_mask, 0) == mask0);
  CHECK(row(b.source_mask, 1) == std::vector<int64_t>(6, 1));
  CHECK(b.source_rows() == std::vector<std::vector<int64_t>>{s0, s1});
  // Labels: target ids and eos, -100 on padding; decoder input: start, then labels shifted.
  std::vector<int64_t> t0 = ids(ref, tgt[0]), t1 = ids(ref, "el");
  t0.resize(std::min<size_t>(t0.size(), 5));
  t0.push_back(V + 1), t1.push_back(V + 1);
  const auto T = int64_t(t0.size());
  REQUIRE(b.labels.shape() == (Shape{2, T}));
  std::vector<int64_t> l1 = t1, d0{V}, d1{V};
  l1.resize(size_t(T), -100);
  d0.insert(d0.end(), t0.begin(), t0.end() - 1);
  d1.insert(d1.end(), t1.begin(), t1.end() - 1);
  d1.resize(size_t(T), V);
  CHECK(row(b.labels, 0) == t0);
  CHECK(row(b.labels, 1) == l1);
  CHECK(row(b.decoder_in, 0) == d0);
  CHECK(row(b.decoder_in, 1) == d1);
  // Decoding stops at eos and leaves out the ids the tokenizer does not know.
  std::vector<int64_t> gen = ids(ref, "the cat");
  gen.insert(gen.begin(), V);
  gen.push_back(V + 1);
  gen.push_back(ids(ref, "dog")[0]);
  CHECK(enc.decode(gen) == "the cat");
  CHECK_THROWS_WITH(enc.encode(src, std::vector<std::string>{"x"}),
                    Contains("2 sources but 1 targets"));
  CHECK_THROWS_WITH(data::Seq2SeqEncoder::with_eos(small_tokenizer(), 1), Contains(">= 2 tokens"));
}

TEST_CASE("seq2seq_logits and seq2seq_generate: a padded batch gives each row what it gives alone",
          "[seq2seq]") {
  const auto enc = data::Seq2SeqEncoder::with_eos(small_tokenizer(), 16);
  const auto model = models::t5({.vocab = enc.vocab_size(),
                                 .dim = 32,
                                 .heads = 4,
                                 .hidden = 64,
                                 .encoder_layers = 2,
                                 .decoder_layers = 2,
                                 .tie_embeddings = false,
                                 .decoder_start = enc.decoder_start()});
  const nn::ParamTree params = nn::init_params(model, 7);
  const std::vector<std::string> src{"the cat sat on the mat", "el gato"},
      tgt{"el gato y el perro", "the dog"};
  NoGradGuard off;
  auto bound = [&] { return train::BoundModel(model, params, nn::Ctx{.train = false}); };
  generation::GenerationConfig how = train::generation_ids(enc);
  how.max_new_tokens = 8, how.num_beams = 4;
  auto both = bound();
  const data::Seq2SeqBatch b = enc.encode(src, tgt);
  const Tensor logits = train::seq2seq_logits(both, b);  // [2, T, V]
  CHECK_FALSE(both.ctx().source.defined());              // the sources do not leak into later calls
  const auto gen = train::seq2seq_generate(both, b, how);
  REQUIRE(gen.size() == 2);
  const int64_t T = logits.shape()[1], V = logits.shape()[2];
  for (int64_t i = 0; i < 2; ++i) {
    auto alone = bound();
    const data::Seq2SeqBatch one =
        enc.encode(std::span(src).subspan(size_t(i), 1), std::span(tgt).subspan(size_t(i), 1));
    const Tensor l = train::seq2seq_logits(alone, one);  // [1, Ti, V]
    const int64_t Ti = l.shape()[1];
    const float* a = logits.data<float>() + i * T * V;
    float worst = 0;
    for (int64_t k = 0; k < Ti * V; ++k)
      worst = std::max(worst, std::abs(a[k] - l.data<float>()[k]));
    CHECK(worst < 1e-4f);
    CHECK(train::seq2seq_generate(alone, one, how)[0] == gen[size_t(i)]);
  }
}
