#pragma once
// What generation does, named as transformers' GenerationConfig names it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "redco/core/dtype.hpp"

namespace redco::generation {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct GenerationConfig {
  // ---- length and stopping
  int64_t max_new_tokens = 32;
  int64_t min_new_tokens = 0;            // end-of-sequence ids are banned before this many
  std::vector<int64_t> eos_token_ids{};  // a row stops after emitting one of them
  int64_t pad_token_id = 0;              // fills finished rows of a batch and beams
  // ---- forced tokens, as transformers' ForcedBOS/ForcedEOSTokenLogitsProcessor
  // (-1: off): the token after a one-token decoder input (an encoder-decoder's
  // first generated token, BART-large's bos), and the last token a row can
  // generate (its max_new_tokens-th)
  int64_t forced_bos_token_id = -1;
  int64_t forced_eos_token_id = -1;
  // ---- encoder-decoders (generate_seq2seq): the decoder's first input
  // (T5: the pad id; BART: eos, its decoder_start_token_id); -1: unset
  int64_t decoder_start_token_id = -1;
  // A row stops at the token whose text completes one of these (the match
  // may start earlier, in the prompt too), as transformers' stop_strings;
  // needs generate's TextOptions::tokenizer. Matched on the decoded text
  // (special tokens left out when TextOptions::skip_special_tokens, where
  // transformers matches their text too). Under beam search a candidate
  // completing one closes its hypothesis, as an end id does.
  std::vector<std::string> stop_strings{};
  // ---- sampling (greedy when off)
  bool do_sample = false;
  float temperature = 1.f;
  int64_t top_k = 0;  // keep the k most likely tokens (0: all)
  float top_p = 1.f;  // keep the smallest set of top tokens whose mass reaches top_p
  float min_p = 0.f;  // keep tokens at least min_p times as likely as the top one
  // ---- penalties
  float repetition_penalty = 1.f;  // > 1 discourages tokens already in the row (CTRL)
  float presence_penalty = 0.f;    // subtracted from a seen token's logit, once
  float frequency_penalty = 0.f;   // subtracted per occurrence
  int64_t no_repeat_ngram_size = 0;
  // ---- beam search (num_beams > 1)
  int64_t num_beams = 1;
  float length_penalty = 1.f;   // scores are sum log p / length^length_penalty
  bool early_stopping = false;  // stop a prompt's search once num_beams hypotheses are done
  int64_t num_return_sequences = 1;
  // ---- randomness: a prompt's draws depend on (seed, the prompt, the step) only,
  // so it gets the same tokens in any batch and on any mesh.
  uint64_t seed = 0;
  // ---- the KV cache's elements: f32, or bf16 (half the bytes each decode step
  // reads back); unset: bf16 when the model's weights are bf16 or int8, else f32
  std::optional<DType> cache_dtype{};
};

// Throws a redco::Error naming the first option out of range.
void check(const GenerationConfig& c, int64_t vocab = 0);

}  // namespace redco::generation
