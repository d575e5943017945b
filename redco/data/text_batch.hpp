#pragma once
// Texts as the padded batches an encoder (BERT, RoBERTa) reads: token ids
// and the attention mask, right-padded to the longest text of the batch and
// truncated to max_length. What every text-classification collate repeats.
//
//   auto enc = data::TextEncoder::pretrained(data::Tokenizer::from_file(dir), 128);  // [CLS] ..
//   [SEP] auto enc = data::TextEncoder::with_cls(data::load_or_train_bpe(file, text, 4096), 128);
//   data::TextBatch b = enc.encode(texts);   // ids, mask: i64 [B, T]
//   cfg.vocab = enc.vocab_size();            // what the embedding must hold
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "redco/core/tensor.hpp"
#include "redco/data/tokenizer.hpp"

namespace redco::data {

struct TextBatch {
  Tensor ids;   // i64 [B, T], T = the longest encoding of the batch (<= max_length)
  Tensor mask;  // i64 [B, T]: 1 for a token, 0 for padding (Hugging Face's attention_mask)
};

// A text with its class (classification) or its value (regression), and a
// batch of them as a classifier or regressor trains on it.
struct LabelledText {
  std::string text;
  int64_t label = 0;  // the class
  float target = 0;   // the value
};
struct LabelledBatch {
  TextBatch x;     // ids, mask: i64 [B, T]
  Tensor labels;   // i64 [B]
  Tensor targets;  // f32 [B]
};
std::vector<int64_t> labels_of(std::span<const LabelledText> ex);
std::vector<float> targets_of(std::span<const LabelledText> ex);

class TextEncoder {
 public:
  // A checkpoint's tokenizer.json, whose post-processor adds the model's
  // special tokens ([CLS] ... [SEP], <s> ... </s>); padding with its
  // pad_token, else `pad_id` (config.json's pad_token_id).
  static TextEncoder pretrained(Tokenizer tok, int64_t max_length, int32_t pad_id = 0);
  // A tokenizer without special tokens (data::Bpe's): id V (its vocabulary
  // size) is a [CLS] put first, whose final state the classifier reads, and
  // V + 1 the padding; vocab_size() is V + 2 rounded up to a multiple of 64,
  // so the embedding splits evenly over model shards.
  static TextEncoder with_cls(Tokenizer tok, int64_t max_length);

  // Encodes on the oneTBB pool; every text gives at least its [CLS].
  TextBatch encode(std::span<const std::string> texts) const;
  // The texts encoded as above, with their labels and targets.
  LabelledBatch encode(std::span<const LabelledText> examples) const;
  int64_t vocab_size() const { return vocab_; }
  int32_t pad_id() const { return pad_; }
  int64_t max_length() const { return max_length_; }
  const Tokenizer& tokenizer() const { return tok_; }

 private:
  TextEncoder(Tokenizer tok, int64_t max_length);
  Tokenizer tok_;
  int64_t max_length_ = 0, vocab_ = 0;
  int32_t cls_ = -1;  // >= 0: put first by encode (with_cls)
  int32_t pad_ = 0;
};

}  // namespace redco::data
