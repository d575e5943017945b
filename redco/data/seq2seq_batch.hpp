#pragma once
// Pairs of texts as the batches an encoder-decoder (T5, BART) trains on, and
// generated ids back as text: what every translation or summarisation
// collate and predict repeat.
//
//   auto enc = data::Seq2SeqEncoder::with_eos(data::load_or_train_bpe(file, text, 8000), 128);
//   data::Seq2SeqBatch b = enc.encode(sources, targets);  // source, mask, decoder_in, labels
//   cfg.vocab = enc.vocab_size(), cfg.decoder_start = enc.decoder_start();
//   std::string text = enc.decode(generated_ids);         // up to the end-of-sequence id
//
// Labels are the target's ids and the end-of-sequence id, -100 (ignored by
// cross_entropy) on padding; the decoder's input is decoder_start and the
// labels shifted right by one, padding where they are -100 (transformers'
// shift_tokens_right).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "redco/core/tensor.hpp"
#include "redco/data/tokenizer.hpp"

namespace redco::data {

// A source text and its target (translation, summary, answer).
struct TextPair {
  std::string source, target;
};
std::vector<std::string> sources(std::span<const TextPair> pairs);
std::vector<std::string> targets(std::span<const TextPair> pairs);

struct Seq2SeqBatch {
  Tensor source;       // i64 [B, Ts]: encoder input ids, right-padded
  Tensor source_mask;  // i64 [B, Ts]: 1 for a token, 0 for padding
  Tensor decoder_in;   // i64 [B, Tt]: decoder_start, then the labels but the last
  Tensor labels;       // i64 [B, Tt]: target ids and eos; -100 on padding
  // The sources without their padding (what generation takes), one per row.
  std::vector<std::vector<int64_t>> source_rows() const;
};

// The ids that frame a model's texts: padding, the end-of-sequence ids (the
// first one is appended), the decoder's first input. A checkpoint's come from
// its generation settings (train::seq2seq_ids of models::generation_config).
struct Seq2SeqIds {
  int64_t pad = 0;
  std::vector<int64_t> eos{};
  int64_t decoder_start = -1;
};

class Seq2SeqEncoder {
 public:
  // A tokenizer without special tokens (data::Bpe's): id V (its vocabulary
  // size) pads and starts the decoder (T5's convention), V + 1 ends each
  // sequence; vocab_size() is V + 2 rounded up to a multiple of 64, so the
  // embedding splits evenly over model shards.
  static Seq2SeqEncoder with_eos(Tokenizer tok, int64_t max_length);
  // A checkpoint's tokenizer.json, whose post-processor adds the model's
  // special tokens (T5: "… </s>", BART: "<s> … </s>"), with the ids of its
  // generation settings (train::seq2seq_ids(models::generation_config(dir))).
  static Seq2SeqEncoder pretrained(Tokenizer tok, int64_t max_length, const Seq2SeqIds& ids);

  // Sources and targets of one batch, each truncated to max_length tokens.
  Seq2SeqBatch encode(std::span<const std::string> sources,
                      std::span<const std::string> targets) const;
  Seq2SeqBatch encode(std::span<const TextPair> pairs) const {
    return encode(data::sources(pairs), data::targets(pairs));
  }
  // Each text's ids as the batches hold them: special tokens and eos included, truncated.
  std::vector<std::vector<int64_t>> ids(std::span<const std::string> texts) const;
  // Generated ids as text: up to the first end-of-sequence id, special tokens left out.
  std::string decode(std::span<const int64_t> ids) const;
  // The pad, end-of-sequence and decoder start ids (train::generation_ids
  // makes them the start of a generation config).
  const Seq2SeqIds& special_ids() const { return ids_; }

  int64_t vocab_size() const { return vocab_; }
  int64_t pad_id() const { return ids_.pad; }
  int64_t eos_id() const { return ids_.eos.front(); }
  int64_t decoder_start() const { return ids_.decoder_start; }
  int64_t max_length() const { return max_length_; }
  const Tokenizer& tokenizer() const { return tok_; }

 private:
  Seq2SeqEncoder(Tokenizer tok, int64_t max_length);
  Tokenizer tok_;
  int64_t max_length_ = 0, vocab_ = 0;
  bool append_eos_ = false;  // with_eos: the tokenizer adds no special tokens
  Seq2SeqIds ids_;
};

}  // namespace redco::data
