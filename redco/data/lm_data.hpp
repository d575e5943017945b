#pragma once
// What every language-model pipeline repeats: a tokenizer loaded or learned
// from the training text, the text as token ids, windows of consecutive
// tokens over them, the shifted (inputs, targets) batch of a set of windows,
// and the unigram entropy that a model must beat to have learned any context.
//
//   data::Tokenizer tok = data::load_or_train_bpe(workdir / "tokenizer.json", text, 2048);
//   std::vector<int64_t> ids = data::token_ids(tok, text);
//   std::vector<data::TokenWindow> ws = data::token_windows(ids, 128);  // 129 tokens each
//   data::LmBatch b = data::shifted_batch(ws);  // inputs/targets i64 [B, 128]
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "redco/data/text.hpp"
#include "redco/data/tokenizer.hpp"

namespace redco::data {

// The tokenizer.json at `file` when it exists and has `vocab_size` tokens;
// otherwise a byte-level BPE learned from `text` with data::Bpe, written to
// `file` when `save` (through a temporary file renamed into place, so another
// process never reads half of it), and loaded back through data::Tokenizer.
// Learning is deterministic: processes that each learn one get the same, and
// only one of them needs to save it. (A text too short to yield `vocab_size`
// tokens gives fewer, and is learned again on every call.)
Tokenizer load_or_train_bpe(const std::filesystem::path& file, std::string_view text,
                            int64_t vocab_size, bool save = true);

// A pipeline's tokenizer and the tokenizer.json it comes from (which an
// exported model folder copies): `file` when not empty; else the checkpoint
// folder's own when `checkpoint` is not empty (fine-tuning keeps the
// pretrained vocabulary); else load_or_train_bpe(learned, text, vocab_size, save).
struct TokenizerFile {
  Tokenizer tok;
  std::filesystem::path file;
};
TokenizerFile pick_tokenizer(const std::filesystem::path& file,
                             const std::filesystem::path& checkpoint,
                             const std::filesystem::path& learned, std::string_view text,
                             int64_t vocab_size, bool save = true);

// The ids of `text`, without special tokens, as the i64 a model takes.
std::vector<int64_t> token_ids(const Tokenizer& tok, std::string_view text);

// A training example: context + 1 consecutive tokens.
using TokenWindow = std::span<const int64_t>;

// Windows of context + 1 tokens starting every `stride` tokens (0: every
// `context`, so each window's inputs follow the previous one's without gap or
// overlap). Views into `tokens`, which must outlive them; a tail too short
// for a whole window is left out. Throws redco::Error for context < 1.
std::vector<TokenWindow> token_windows(std::span<const int64_t> tokens, int64_t context,
                                       int64_t stride = 0);

// The inputs (each window without its last token) and targets (without its
// first) of windows of one length: i64 [B, T] each, T = window length - 1.
LmBatch shifted_batch(std::span<const TokenWindow> windows);

// The entropy of the token frequencies in nats: the loss of the best model
// that ignores the context.
double unigram_entropy(std::span<const int64_t> tokens);

}  // namespace redco::data
