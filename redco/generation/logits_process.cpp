// Logits processors and samplers for generation (see logits_process.hpp).
#include "redco/generation/logits_process.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "redco/core/error.hpp"

namespace redco::generation {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

void check(const GenerationConfig& c, int64_t vocab) {
  auto need = [](bool ok, const char* what) { REDCO_CHECK(ok, "generation config: {}", what); };
  need(c.max_new_tokens >= 0, "max_new_tokens must be >= 0");
  need(c.min_new_tokens >= 0, "min_new_tokens must be >= 0");
  need(!c.do_sample || c.temperature > 0.f, "temperature must be > 0 when sampling");
  need(c.top_k >= 0, "top_k must be >= 0 (0: off)");
  need(c.top_p > 0.f && c.top_p <= 1.f, "top_p must be in (0, 1]");
  need(c.min_p >= 0.f && c.min_p <= 1.f, "min_p must be in [0, 1]");
  need(c.repetition_penalty > 0.f, "repetition_penalty must be > 0 (1: off)");
  need(c.no_repeat_ngram_size >= 0, "no_repeat_ngram_size must be >= 0");
  need(c.num_beams >= 1, "num_beams must be >= 1");
  need(!c.cache_dtype || *c.cache_dtype == DType::f32 || *c.cache_dtype == DType::bf16,
       "cache_dtype must be f32 or bf16");
  need(std::none_of(c.stop_strings.begin(), c.stop_strings.end(),
                    [](const std::string& s) { return s.empty(); }),
       "stop_strings must not hold an empty string");
  need(c.num_return_sequences >= 1, "num_return_sequences must be >= 1");
  need(c.num_beams == 1 || c.num_return_sequences <= c.num_beams,
       "num_return_sequences must be <= num_beams");
  need(c.num_beams == 1 || !c.do_sample, "beam search with sampling is not implemented");
  need(c.num_beams > 1 || c.do_sample || c.num_return_sequences == 1,
       "greedy decoding returns one sequence per prompt (num_return_sequences must be 1)");
  for (int64_t e : c.eos_token_ids)
    REDCO_CHECK(e >= 0 && (vocab == 0 || e < vocab),
                "generation config: eos token id {} is not in the vocabulary [0, {})", e, vocab);
  for (auto [name, id] : {std::pair{"forced_bos_token_id", c.forced_bos_token_id},
                          std::pair{"forced_eos_token_id", c.forced_eos_token_id},
                          std::pair{"decoder_start_token_id", c.decoder_start_token_id}})
    REDCO_CHECK(id >= -1 && (vocab == 0 || id < vocab),
                "generation config: {} {} is not in the vocabulary [0, {}) (-1: unset)", name, id,
                vocab);
}

void RowHistory::push(int64_t token, bool generated) {
  tokens.push_back(token);
  if (generated) ++count[token];
}

void apply_processors(std::span<float> row, const RowHistory& h, const GenerationConfig& c) {
  const auto V = int64_t(row.size());
  if (c.repetition_penalty != 1.f) {  // every distinct token of the row, prompt included
    thread_local std::vector<int64_t> seen;
    seen.assign(h.tokens.begin(), h.tokens.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int64_t t : seen)
      if (t >= 0 && t < V) {
        float& x = row[size_t(t)];
        x = x < 0 ? x * c.repetition_penalty : x / c.repetition_penalty;
      }
  }
  if (c.presence_penalty != 0.f || c.frequency_penalty != 0.f)
    for (const auto& [t, n] : h.count)
      if (t >= 0 && t < V) row[size_t(t)] -= c.presence_penalty + c.frequency_penalty * float(n);
  const int64_t n = c.no_repeat_ngram_size, len = int64_t(h.tokens.size());
  if (n > 0 && len + 1 >= n) {  // ban what would repeat an n-gram of the row
    const int64_t* tail = h.tokens.data() + len - (n - 1);
    for (int64_t s = 0; s + n <= len; ++s)
      if (std::equal(tail, tail + n - 1, h.tokens.data() + s)) {
        const int64_t banned = h.tokens[size_t(s + n - 1)];
        if (banned >= 0 && banned < V) row[size_t(banned)] = kNegInf;
      }
  }
  if (h.generated() < c.min_new_tokens)
    for (int64_t e : c.eos_token_ids)
      if (e < V) row[size_t(e)] = kNegInf;
  // transformers forces by the input's length: bos after a one-token input,
  // eos when one more token reaches max_length (= input + max_new_tokens).
  int64_t forced = -1;
  if (c.forced_bos_token_id >= 0 && h.tokens.size() == 1) forced = c.forced_bos_token_id;
  if (c.forced_eos_token_id >= 0 && h.generated() == c.max_new_tokens - 1)
    forced = c.forced_eos_token_id;
  if (forced >= 0 && forced < V) {
    std::fill(row.begin(), row.end(), kNegInf);
    row[size_t(forced)] = 0.f;
  }
}

int64_t first_argmax(std::span<const float> row) {
  return int64_t(std::max_element(row.begin(), row.end()) - row.begin());
}

bool log_softmax_inplace(std::span<float> row) {
  const float m = row[size_t(first_argmax(row))];
  if (!std::isfinite(m)) return false;
  double sum = 0;
  for (float x : row) sum += std::exp(double(x - m));
  const float lse = m + float(std::log(sum));
  for (float& x : row) x -= lse;
  return true;
}

int64_t Sampler::choose(std::span<float> row, const GenerationConfig& c, float u) {
  const auto V = int64_t(row.size());
  const int64_t best = first_argmax(row);
  REDCO_CHECK(std::isfinite(row[size_t(best)]) || row[size_t(best)] > 0,
              "generation: every token of a row is banned or its logits are not finite (NaN?)");
  if (!c.do_sample) return best;
  // Probabilities of logits / temperature, most likely first (ties in id order).
  const float m = row[size_t(best)];
  prob_.resize(size_t(V));
  order_.resize(size_t(V));
  std::iota(order_.begin(), order_.end(), 0);
  double total = 0;
  for (int64_t v = 0; v < V; ++v)
    total += prob_[size_t(v)] = std::exp((row[size_t(v)] - m) / c.temperature);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int64_t a, int64_t b) { return prob_[size_t(a)] > prob_[size_t(b)]; });
  int64_t kept = V;
  if (c.top_k > 0 && c.top_k < V) {  // ties with the k-th are kept, as transformers does
    const float kth = prob_[size_t(order_[size_t(c.top_k - 1)])];
    kept = c.top_k;
    while (kept < V && prob_[size_t(order_[size_t(kept)])] >= kth) ++kept;
  }
  double mass = 0;
  for (int64_t i = 0; i < kept; ++i) mass += prob_[size_t(order_[size_t(i)])];
  if (c.top_p < 1.f) {  // the smallest head whose share of the mass reaches top_p
    double cum = 0;
    int64_t i = 0;
    while (i < kept && (i == 0 || cum < double(c.top_p) * mass))
      cum += prob_[size_t(order_[size_t(i++)])];
    kept = i, mass = cum;
  }
  if (c.min_p > 0.f) {  // relative to the top token (probability 1 before normalising)
    int64_t i = 1;
    double cum = prob_[size_t(order_[0])];
    while (i < kept && prob_[size_t(order_[size_t(i)])] >= c.min_p)
      cum += prob_[size_t(order_[size_t(i++)])];
    kept = i, mass = cum;
  }
  const double target = double(u) * mass;
  double cum = 0;
  for (int64_t i = 0; i < kept; ++i) {
    cum += prob_[size_t(order_[size_t(i)])];
    if (target < cum) return order_[size_t(i)];
  }
  return order_[size_t(kept - 1)];
}

}  // namespace redco::generation
