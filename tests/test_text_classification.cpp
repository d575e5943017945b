// What text classifiers share: padded id batches (data::TextEncoder), the
// mask reaching the model through BoundModel, classifiers fine-tuned from a
// checkpoint's encoder, and the metrics.
#include <catch2/catch.hpp>
#include <filesystem>

#include "gradcheck.hpp"
#include "hf_fixtures.hpp"
#include "redco/data/bpe.hpp"
#include "redco/data/text_batch.hpp"
#include "redco/models/encoder_classifier.hpp"
#include "redco/train/bound_model.hpp"
#include "redco/train/metrics.hpp"

using namespace redco;
using Catch::Matchers::Contains;

namespace {

std::vector<int64_t> row(const Tensor& t, int64_t r) {
  const int64_t T = t.shape()[1];
  const int64_t* p = t.data<int64_t>() + r * T;
  return {p, p + T};
}
std::vector<int64_t> ids64(const data::Encoding& e) { return {e.ids.begin(), e.ids.end()}; }

}  // namespace

TEST_CASE("TextEncoder::with_cls: [CLS] first, right padding, truncation, vocabulary", "[text]") {
  const std::string corpus = "the cat sat on the mat; the dog sat on the log. ";
  auto tok = [&] {
    return data::Tokenizer::from_json(data::Bpe::train(corpus + corpus, 300).to_tokenizer_json());
  };
  const data::Tokenizer ref = tok();
  const int64_t V = ref.vocab_size();
  const auto enc = data::TextEncoder::with_cls(tok(), 6);
  CHECK(enc.vocab_size() == (V + 2 + 63) / 64 * 64);
  CHECK(enc.vocab_size() % 64 == 0);
  CHECK(enc.pad_id() == V + 1);
  const std::vector<std::string> texts{"the cat", "the dog sat on the log. the cat sat on the mat",
                                       ""};
  const data::TextBatch b = enc.encode(texts);
  const std::vector<int64_t> cat = ids64(ref.encode("the cat"));
  const auto T = int64_t(b.ids.shape()[1]);
  CHECK(T == 6);  // the long text is cut to max_length, [CLS] included
  std::vector<int64_t> want0{V};
  want0.insert(want0.end(), cat.begin(), cat.end());
  want0.resize(size_t(T), V + 1);
  CHECK(row(b.ids, 0) == want0);
  std::vector<int64_t> mask0(size_t(T), 0);
  std::fill_n(mask0.begin(), 1 + cat.size(), 1);
  CHECK(row(b.mask, 0) == mask0);
  const std::vector<int64_t> longest = ids64(ref.encode(texts[1]));
  CHECK(row(b.ids, 1) ==
        std::vector<int64_t>{V, longest[0], longest[1], longest[2], longest[3], longest[4]});
  CHECK(row(b.mask, 1) == std::vector<int64_t>(6, 1));
  CHECK(row(b.ids, 2)[0] == V);  // an empty text still has its [CLS]
  CHECK(row(b.mask, 2) == std::vector<int64_t>{1, 0, 0, 0, 0, 0});
  CHECK_THROWS_WITH(data::TextEncoder::with_cls(tok(), 1), Contains("max_length must be >= 2"));
}

TEST_CASE("TextEncoder: labelled texts batch as their texts, with labels and targets", "[text]") {
  const std::string corpus = "the cat sat on the mat; the dog sat on the log. ";
  const auto enc = data::TextEncoder::with_cls(
      data::Tokenizer::from_json(data::Bpe::train(corpus + corpus, 300).to_tokenizer_json()), 8);
  const std::vector<data::LabelledText> ex{{"the dog sat", 2, 0.25f}, {"the cat", 0, -1.5f}};
  const data::LabelledBatch b = enc.encode(std::span<const data::LabelledText>(ex));
  const std::vector<std::string> texts{"the dog sat", "the cat"};
  const data::TextBatch plain = enc.encode(texts);
  REQUIRE(b.x.ids.shape() == plain.ids.shape());
  for (int64_t i = 0; i < 2; ++i) {
    CHECK(row(b.x.ids, i) == row(plain.ids, i));
    CHECK(row(b.x.mask, i) == row(plain.mask, i));
  }
  CHECK(b.labels.dtype() == DType::i64);
  CHECK(b.labels.to_vector() == std::vector<float>{2.f, 0.f});
  CHECK(b.targets.dtype() == DType::f32);
  CHECK(b.targets.to_vector() == std::vector<float>{0.25f, -1.5f});
  CHECK(data::labels_of(ex) == std::vector<int64_t>{2, 0});
  CHECK(data::targets_of(ex) == std::vector<float>{0.25f, -1.5f});
}

TEST_CASE("TextEncoder::pretrained: the tokenizer's [CLS] ... [SEP], padded", "[text]") {
  const auto file = test::hf_fixture().parent_path().parent_path() / "data" / "tokenizers" /
                    "bert" / "tokenizer.json";
  const data::Tokenizer ref = data::Tokenizer::from_file(file);
  const auto enc = data::TextEncoder::pretrained(data::Tokenizer::from_file(file), 5, 0);
  const data::TextBatch b = enc.encode(std::vector<std::string>{"world", "world world world"});
  const std::vector<int64_t> one = ids64(ref.encode("world"));  // [CLS] world [SEP]
  REQUIRE(one.size() == 3);
  CHECK(one.front() == ref.token_to_id("[CLS]"));
  CHECK(row(b.ids, 0) == std::vector<int64_t>{one[0], one[1], one[2], 0, 0});
  CHECK(row(b.mask, 0) == std::vector<int64_t>{1, 1, 1, 0, 0});
  // Truncated to 5 with both special tokens kept.
  CHECK(row(b.ids, 1) == std::vector<int64_t>{one[0], one[1], one[1], one[1], one[2]});
  CHECK(enc.vocab_size() == ref.vocab_size());
}

TEST_CASE("BoundModel(x, mask) runs the model on a padded batch, for that call", "[text]") {
  const models::BertConfig c{
      .vocab = 50, .dim = 16, .layers = 1, .heads = 2, .hidden = 32, .context = 8, .labels = 3};
  const auto model = models::bert(c);
  const nn::ParamTree params = nn::init_params(model, 7);
  Tensor ids = Tensor::empty({2, 5}, DType::i64), mask = Tensor::empty({2, 5}, DType::i64);
  for (int64_t i = 0; i < 10; ++i) {
    ids.data<int64_t>()[i] = 1 + i * 3 % 40;
    mask.data<int64_t>()[i] = i < 7 ? 1 : 0;  // row 0 holds 5 tokens, row 1 2
  }
  NoGradGuard no_grad;
  nn::Ctx masked;
  masked.mask = mask;
  const Tensor want = nn::apply(model, params, ids, masked);
  const Tensor plain = nn::apply(model, params, ids);
  train::BoundModel bound(model, params, nn::Ctx{});
  CHECK(test::max_abs_diff(bound(ids, mask), want) == 0.f);
  CHECK(test::max_abs_diff(bound(ids), plain) == 0.f);  // the mask was for one call
  CHECK(test::max_abs_diff(want, plain) > 1e-4f);
}

TEST_CASE("classifier_from_pretrained: the checkpoint's encoder, a new head", "[text]") {
  const auto dir = test::hf_fixture("bert");  // BertForSequenceClassification, 3 labels
  const auto p = models::classifier_from_pretrained<models::Bert>(dir, 5, 11);
  const auto enc = models::from_pretrained<models::BertEncoder>(dir);
  const nn::ParamTree fresh = nn::init_params(p.model, 11);
  CHECK(p.config.labels == 5);
  CHECK(p.params.size() == fresh.size());
  for (const auto& [name, t] : p.params) {
    INFO(name);
    if (enc.params.count(name)) {
      CHECK(test::max_abs_diff(t, enc.params.at(name)) == 0.f);
    } else {  // pooler and classifier: drawn from the seed
      CHECK((name.starts_with("pooler.") || name.starts_with("classifier.")));
      CHECK(test::max_abs_diff(t, fresh.at(name)) == 0.f);
    }
  }
  CHECK(p.params.at("classifier.weight").shape() == (Shape{5, p.config.dim}));
  const auto r =
      models::classifier_from_pretrained<models::Roberta>(test::hf_fixture("roberta"), 1, 3);
  CHECK(r.params.at("classifier.out_proj.weight").shape() == (Shape{1, r.config.dim}));
  CHECK_THROWS_WITH(
      models::classifier_from_pretrained<models::Bert>(test::hf_fixture("roberta"), 2, 0),
      Contains("roberta"));
}

TEST_CASE("accuracy, macro-F1 and mean squared error", "[text]") {
  // Per class F1 = 2TP / (2TP + FP + FN): 2/4, 4/5, 2/3; class 3 never occurs.
  const std::vector<int64_t> y{0, 0, 1, 1, 2, 2}, p{0, 1, 1, 1, 0, 2};
  const io::Metrics m = train::classification_metrics(y, p, 4);
  CHECK(m[0].first == "accuracy");
  CHECK(m[0].second == Approx(4.0 / 6));
  CHECK(m[1].first == "macro_f1");
  CHECK(m[1].second == Approx((0.5 + 0.8 + 2.0 / 3) / 3));
  // A class only predicted counts, with F1 0 (scikit-learn: 1/3).
  CHECK(train::classification_metrics(std::vector<int64_t>{0, 0}, std::vector<int64_t>{0, 1}, 2)[1]
            .second == Approx(1.0 / 3));
  CHECK_THROWS_WITH(train::classification_metrics(y, p, 2), Contains("classes are 0..1"));
  CHECK(train::mean_squared_error(std::vector<float>{0, 1, 2}, std::vector<float>{1, 1, 0}) ==
        Approx(5.0 / 3));
  CHECK_THROWS_WITH(train::mean_squared_error(std::vector<float>{0}, std::vector<float>{}),
                    Contains("1 targets but 0 predictions"));
}

TEST_CASE("what ignoring the input scores: majority class, mean target", "[text]") {
  // Training labels: 2 is the most frequent; validation has it twice in five.
  const std::vector<int64_t> train_y{2, 0, 2, 1, 2}, valid_y{2, 1, 0, 2, 1};
  CHECK(train::majority_accuracy(train_y, valid_y, 3) == Approx(2.0 / 5));
  // A tie goes to the lowest class.
  CHECK(train::majority_accuracy(std::vector<int64_t>{1, 0}, std::vector<int64_t>{0, 0, 1}, 2) ==
        Approx(2.0 / 3));
  CHECK_THROWS_WITH(train::majority_accuracy(train_y, valid_y, 2), Contains("classes are 0..1"));
  // Mean training target 1: validation errors 1, 0, 4.
  CHECK(train::mean_target_mse(std::vector<float>{0, 1, 2}, std::vector<float>{0, 1, 3}) ==
        Approx(5.0 / 3));
  CHECK_THROWS_WITH(train::mean_target_mse(std::vector<float>{}, std::vector<float>{1}),
                    Contains("got 0 and 1"));
}
