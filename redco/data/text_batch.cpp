#include "redco/data/text_batch.hpp"

#include <algorithm>

#include "redco/core/error.hpp"

namespace redco::data {

TextEncoder::TextEncoder(Tokenizer tok, int64_t max_length)
    : tok_(std::move(tok)), max_length_(max_length) {
  REDCO_CHECK(max_length >= 2, "TextEncoder: max_length must be >= 2 tokens, got {}", max_length);
}

TextEncoder TextEncoder::pretrained(Tokenizer tok, int64_t max_length, int32_t pad_id) {
  TextEncoder e(std::move(tok), max_length);
  e.tok_.set_truncation(Truncation{.max_length = max_length});
  const int32_t named = e.tok_.special_token_id("pad_token");
  e.pad_ = named >= 0 ? named : pad_id;
  e.vocab_ = e.tok_.vocab_size();
  return e;
}

TextEncoder TextEncoder::with_cls(Tokenizer tok, int64_t max_length) {
  TextEncoder e(std::move(tok), max_length);
  e.tok_.set_truncation(Truncation{.max_length = max_length - 1});  // room for [CLS]
  const int64_t v = e.tok_.vocab_size();
  e.cls_ = int32_t(v);
  e.pad_ = int32_t(v + 1);
  e.vocab_ = (v + 2 + 63) / 64 * 64;
  return e;
}

TextBatch TextEncoder::encode(std::span<const std::string> texts) const {
  REDCO_CHECK(!texts.empty(), "TextEncoder::encode: no texts");
  const EncodingBatch enc = tok_.encode_batch(texts, /*add_special_tokens=*/true);
  const int64_t extra = cls_ >= 0 ? 1 : 0;
  size_t longest = 1;
  for (size_t i = 0; i < enc.size(); ++i)
    longest = std::max(longest, enc[i].ids.size() + size_t(extra));
  const auto B = int64_t(texts.size()), T = int64_t(longest);
  TextBatch b{Tensor::empty({B, T}, DType::i64), Tensor::empty({B, T}, DType::i64)};
  int64_t* ids = b.ids.data<int64_t>();    // [B, T]
  int64_t* mask = b.mask.data<int64_t>();  // [B, T]
  std::fill_n(ids, B * T, int64_t(pad_));
  std::fill_n(mask, B * T, int64_t(0));
  for (int64_t i = 0; i < B; ++i) {
    int64_t* row = ids + i * T;
    if (cls_ >= 0) row[0] = cls_;
    const std::span<const int32_t> t = enc[size_t(i)].ids;
    std::copy(t.begin(), t.end(), row + extra);
    std::fill_n(mask + i * T, extra + int64_t(t.size()), int64_t(1));
  }
  return b;
}

LabelledBatch TextEncoder::encode(std::span<const LabelledText> examples) const {
  const auto B = int64_t(examples.size());
  std::vector<std::string> texts;
  texts.reserve(examples.size());
  for (const LabelledText& e : examples) texts.push_back(e.text);
  LabelledBatch b{encode(texts), Tensor::empty({B}, DType::i64), Tensor::empty({B})};
  for (int64_t i = 0; i < B; ++i) {
    b.labels.data<int64_t>()[i] = examples[size_t(i)].label;
    b.targets.data<float>()[i] = examples[size_t(i)].target;
  }
  return b;
}

std::vector<int64_t> labels_of(std::span<const LabelledText> ex) {
  std::vector<int64_t> out;
  for (const LabelledText& e : ex) out.push_back(e.label);
  return out;
}

std::vector<float> targets_of(std::span<const LabelledText> ex) {
  std::vector<float> out;
  for (const LabelledText& e : ex) out.push_back(e.target);
  return out;
}

}  // namespace redco::data
