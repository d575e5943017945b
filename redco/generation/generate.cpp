// Generation with a KV cache: greedy and sampled decoding, and beam search
// with transformers' scoring (length-normalised hypotheses, early stopping).
#include "redco/generation/generate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <tuple>

#include "redco/core/philox.hpp"
#include "redco/generation/logits_process.hpp"
#include "redco/generation/steps.hpp"
#include "redco/generation/text.hpp"

namespace redco::generation {
namespace {

using detail::Prompts;
using detail::row_stream;

// Row r of the batch is prompt r / copies.
struct Batch {
  Prompts rows;
  int64_t copies = 1;
  int64_t longest = 0;
};
Batch expand(const Prompts& prompts, int64_t copies) {
  Batch b{{}, copies, 0};
  for (size_t i = 0; i < prompts.size(); ++i) {
    REDCO_CHECK(!prompts[i].empty(), "generate: prompt {} is empty (it needs at least one token)",
                i);
    b.longest = std::max(b.longest, int64_t(prompts[i].size()));
    for (int64_t c = 0; c < copies; ++c) b.rows.push_back(prompts[i]);
  }
  return b;
}

// An encoder-decoder row's source tokens (padding left out): its random
// stream follows them too, so different sources draw differently and a
// source draws the same alone or in any batch. Empty without ctx.source.
std::vector<int64_t> source_tokens(const Tensor& source, const Tensor& mask, int64_t row) {
  if (!source.defined()) return {};
  const Tensor ids = source.to(Device::cpu()).to(DType::i64);
  const Tensor m = mask.defined() ? mask.to(Device::cpu()).to(DType::f32) : Tensor();
  const int64_t T = ids.dim(1);
  std::vector<int64_t> out;
  for (int64_t t = 0; t < T; ++t)
    if (!m.defined() || m.data<float>()[row * T + t] != 0.f)
      out.push_back(ids.data<int64_t>()[row * T + t]);
  return out;
}

bool is_eos(const GenerationConfig& c, int64_t t) {
  return std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), t) != c.eos_token_ids.end();
}

Generated sample_or_greedy(const StepFn& step, const Prompts& prompts, const GenerationConfig& c,
                           nn::Ctx ctx, const OnToken& on_token, const TextOptions& text) {
  const int64_t copies = c.do_sample ? c.num_return_sequences : 1;
  const Batch b = expand(prompts, copies);
  const auto R = int64_t(b.rows.size());
  nn::KVCache cache(R, b.longest + std::max<int64_t>(c.max_new_tokens, 1), c.cache_dtype);
  ctx.cache = &cache;
  std::vector<RowHistory> hist(static_cast<size_t>(R));
  std::vector<int64_t> appended(static_cast<size_t>(R));
  std::vector<uint64_t> streams(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t t : b.rows[size_t(r)]) hist[size_t(r)].push(t, false);
    hist[size_t(r)].prompt_length = int64_t(b.rows[size_t(r)].size());
    appended[size_t(r)] = hist[size_t(r)].prompt_length;
    std::vector<int64_t> key = b.rows[size_t(r)];
    if (c.do_sample && ctx.source.defined()) {  // one source row per prompt, or per row
      const int64_t src_row = ctx.source.dim(0) == R ? r : r / copies;
      for (int64_t t : source_tokens(ctx.source, ctx.source_mask, src_row)) key.push_back(t);
    }
    streams[size_t(r)] = row_stream(key, r % copies);
  }
  std::optional<detail::RowTexts> texts;
  if (text.tokenizer) texts.emplace(text, b.rows, c.stop_strings);
  Generated out;
  out.sequences.resize(static_cast<size_t>(R));
  std::vector<bool> done(static_cast<size_t>(R), false);
  auto [ids, logit_rows] = detail::prefill_input(b.rows, b.longest, c.pad_token_id);
  Sampler sampler;
  Tensor next = Tensor::empty({R, 1}, DType::i64);
  for (int64_t s = 0; s < c.max_new_tokens; ++s) {
    Tensor logits = detail::run_step(step, ctx, cache, s == 0 ? ids : next, appended,
                                     s == 0 ? logit_rows : Tensor());
    const int64_t V = logits.dim(1);
    if (s == 0) check(c, V);  // the ids against the model's vocabulary
    bool all_done = true;
    for (int64_t r = 0; r < R; ++r) {
      int64_t tok = c.pad_token_id;
      if (!done[size_t(r)]) {
        std::span<float> row(logits.data<float>() + r * V, size_t(V));
        apply_processors(row, hist[size_t(r)], c);
        float u = 0.f;
        if (c.do_sample) philox_uniform(&u, 1, c.seed, streams[size_t(r)], uint64_t(s), 0.f, 1.f);
        tok = sampler.choose(row, c, u);
        hist[size_t(r)].push(tok, true);
        out.sequences[size_t(r)].push_back(tok);
        const bool go_on = !on_token || on_token(r, tok);
        const bool stop = texts && texts->push(r, tok);
        done[size_t(r)] = is_eos(c, tok) || !go_on || stop;
        if (done[size_t(r)] && texts) texts->finish(r);
      }
      next.data<int64_t>()[r] = tok;
      appended[size_t(r)] = done[size_t(r)] ? 0 : 1;
      all_done = all_done && done[size_t(r)];
    }
    if (all_done) break;
  }
  if (texts) texts->finish_all();
  return out;
}

}  // namespace

Generated beam_search(const StepFn& step, const Prompts& prompts, const GenerationConfig& c,
                      nn::Ctx ctx, const TextOptions& text);

Generated generate(const StepFn& step, const Prompts& prompts, const GenerationConfig& c,
                   nn::Ctx ctx, const OnToken& on_token, const TextOptions& text) {
  check(c);
  REDCO_CHECK(c.stop_strings.empty() || text.tokenizer,
              "generate: stop_strings need the tokenizer: pass TextOptions{{.tokenizer = &tok}}");
  REDCO_CHECK(!text.on_text || text.tokenizer,
              "generate: TextOptions::on_text needs TextOptions::tokenizer");
  REDCO_CHECK(!prompts.empty(), "generate: no prompts");
  NoGradGuard no_grad;
  ctx.train = false;
  if (c.max_new_tokens == 0) return {Prompts(prompts.size() * size_t(c.num_return_sequences)), {}};
  if (c.num_beams > 1) return beam_search(step, prompts, c, std::move(ctx), text);
  return sample_or_greedy(step, prompts, c, std::move(ctx), on_token, text);
}

Generated generate_seq2seq(const StepFn& step, const Prompts& sources, const GenerationConfig& c,
                           nn::Ctx ctx, const OnToken& on_token, const TextOptions& text) {
  REDCO_CHECK(!sources.empty(), "generate_seq2seq: no sources");
  REDCO_CHECK(c.decoder_start_token_id >= 0,
              "generate_seq2seq: set decoder_start_token_id, the decoder's first input (the "
              "checkpoint's: models::generation_config(dir); T5 starts from its pad id)");
  std::tie(ctx.source, ctx.source_mask) = detail::source_batch(sources, c.pad_token_id);
  return generate(step, Prompts(sources.size(), {c.decoder_start_token_id}), c, std::move(ctx),
                  on_token, text);
}

}  // namespace redco::generation
