#pragma once
// Internal: what the greedy/sampling loop and beam search share.
#include <utility>
#include <vector>

#include "redco/generation/generate.hpp"

namespace redco::generation::detail {

using Prompts = std::vector<std::vector<int64_t>>;

// A prompt's random stream: its tokens and which of its return sequences
// (so a prompt draws the same tokens in any batch, and in generate or a Batcher).
uint64_t row_stream(const std::vector<int64_t>& prompt, int64_t copy);
// The prefill input: rows right-padded with `pad` to `longest` [R, longest],
// and each row's last position [R] (whose logits are wanted).
std::pair<Tensor, Tensor> prefill_input(const Prompts& rows, int64_t longest, int64_t pad);
// An encoder-decoder's sources right-padded with `pad`: ids i64 [R, longest]
// and their attention mask f32 [R, longest] (1: token, 0: padding).
std::pair<Tensor, Tensor> source_batch(const Prompts& sources, int64_t pad);
// One step: the cache takes appended[r] of row r's inputs; returns logits [R, V] (f32, CPU).
Tensor run_step(const StepFn& step, nn::Ctx& ctx, nn::KVCache& cache, const Tensor& ids,
                std::vector<int64_t> appended, const Tensor& logit_rows);

}  // namespace redco::generation::detail
