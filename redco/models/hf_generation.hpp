#pragma once
// A checkpoint folder's generation settings as transformers' generate()
// reads them: generation_config.json, or config.json when the folder has
// none. What redco models is read (decoder start, end/pad/forced ids, beams,
// penalties, sampling); max_length and min_length (counted with the decoder
// start or the prompt) are not: give max_new_tokens / min_new_tokens.
//
//   auto cfg = models::generation_config("flan-t5-small");
//   cfg.max_new_tokens = 64;
//   auto out = generation::generate_seq2seq(t5.model, t5.params, sources, cfg);
#include <filesystem>

#include "redco/generation/generation_config.hpp"

namespace redco::models {

// `base` supplies what the files leave unset. As transformers does: the
// decoder start falls back to bos_token_id, pad to the first eos id, and
// top_k (used when sampling) to 50.
generation::GenerationConfig generation_config(const std::filesystem::path& dir,
                                               generation::GenerationConfig base = {});

}  // namespace redco::models
