// The pieces every decoding loop shares (steps.hpp).
#include "redco/generation/steps.hpp"

#include <algorithm>
#include <cstring>

#include "redco/core/error.hpp"

namespace redco::generation::detail {

uint64_t row_stream(const std::vector<int64_t>& prompt, int64_t copy) {
  uint64_t h = 1469598103934665603ull ^ uint64_t(copy);  // FNV-1a over the tokens
  for (int64_t t : prompt) h = (h ^ uint64_t(t)) * 1099511628211ull;
  return h;
}

// The prefill input: rows right-padded to the longest, and each row's last position.
std::pair<Tensor, Tensor> prefill_input(const Prompts& rows, int64_t longest, int64_t pad) {
  const auto R = int64_t(rows.size());
  Tensor ids = Tensor::empty({R, longest}, DType::i64);
  Tensor last = Tensor::empty({R}, DType::i64);
  for (int64_t r = 0; r < R; ++r) {
    const auto& p = rows[size_t(r)];
    std::fill_n(ids.data<int64_t>() + r * longest, longest, pad);
    std::copy(p.begin(), p.end(), ids.data<int64_t>() + r * longest);
    last.data<int64_t>()[r] = int64_t(p.size()) - 1;
  }
  return {ids, last};
}

std::pair<Tensor, Tensor> source_batch(const Prompts& sources, int64_t pad) {
  int64_t longest = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    REDCO_CHECK(!sources[i].empty(), "generate_seq2seq: source {} is empty (it needs a token)", i);
    longest = std::max(longest, int64_t(sources[i].size()));
  }
  const auto R = int64_t(sources.size());
  Tensor ids = prefill_input(sources, longest, pad).first;  // [R, longest]
  Tensor mask = Tensor::zeros({R, longest});                // [R, longest]
  for (int64_t r = 0; r < R; ++r)
    std::fill_n(mask.data<float>() + r * longest, sources[size_t(r)].size(), 1.f);
  return {ids, mask};
}

// Runs one step: the cache takes appended[r] of row r's inputs; logits [R, V] (f32, CPU).
Tensor run_step(const StepFn& step, nn::Ctx& ctx, nn::KVCache& cache, const Tensor& ids,
                std::vector<int64_t> appended, const Tensor& logit_rows) {
  cache.begin(std::move(appended));
  ctx.logit_rows = logit_rows;
  Tensor logits = step(ids, ctx);
  cache.commit();
  ctx.logit_rows = Tensor();
  logits = logits.to(Device::cpu()).to(DType::f32);
  REDCO_CHECK(logits.rank() == 3 && logits.dim(0) == ids.dim(0) && logits.dim(1) == 1,
              "generate: the model returned {} for ids {}; expected logits [{}, 1, vocab]",
              logits.shape(), ids.shape(), ids.dim(0));
  return logits.view({logits.dim(0), logits.dim(2)});
}

}  // namespace redco::generation::detail
