// Beam search as transformers scores it: each step every beam's next-token
// log-probabilities (after the processors) are added to its score; of a
// prompt's beams x vocabulary candidates, the 2 x beams best (more with
// several end ids) are walked in order: an end-of-sequence candidate among the
// first `beams` closes a hypothesis scored sum / generated_length^length_penalty,
// the others fill the next beams. A prompt is done once it holds `beams`
// hypotheses and (early_stopping, or) none of its beams can still beat the
// worst of them. The cache follows the beams by reordering its rows.
// A candidate whose token completes a stop string closes a hypothesis as an
// end id does (transformers applies its stopping criteria to the top
// candidates the same way); streamed text is each prompt's final sequences,
// sent when its search ends.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "redco/core/error.hpp"
#include "redco/generation/generate.hpp"
#include "redco/generation/logits_process.hpp"
#include "redco/generation/steps.hpp"
#include "redco/generation/text.hpp"

namespace redco::generation {
namespace {

using detail::Prompts;

struct Hypothesis {
  float score;
  std::vector<int64_t> tokens;  // generated, eos included when it ended with one
};

// The `beams` best finished hypotheses of one prompt.
struct Hypotheses {
  std::vector<Hypothesis> best;
  float worst = 1e9f;
  void add(std::vector<int64_t> tokens, float sum_logprobs, int64_t generated_len,
           const GenerationConfig& c) {
    const float score = sum_logprobs / std::pow(float(generated_len), c.length_penalty);
    if (int64_t(best.size()) >= c.num_beams && score <= worst) return;
    best.push_back({score, std::move(tokens)});
    if (int64_t(best.size()) > c.num_beams) {
      auto w = std::min_element(best.begin(), best.end(),
                                [](const auto& a, const auto& b) { return a.score < b.score; });
      best.erase(w);
    }
    worst = std::min_element(best.begin(), best.end(), [](const auto& a, const auto& b) {
              return a.score < b.score;
            })->score;
  }
  bool is_done(float best_sum, int64_t generated_len, const GenerationConfig& c) const {
    if (int64_t(best.size()) < c.num_beams) return false;
    if (c.early_stopping) return true;
    return worst >= best_sum / std::pow(float(generated_len), c.length_penalty);
  }
};

struct Candidate {
  float score;
  int64_t beam, token;  // beam within the prompt
};

// The n best (score, beam, token) of one prompt, best first (ties: lower index).
void top_candidates(const float* scores, int64_t beams, int64_t V, int64_t n,
                    std::vector<Candidate>& out) {
  out.clear();
  std::vector<int64_t> idx(size_t(beams * V));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  for (int64_t i = 0; i < n; ++i)
    out.push_back({scores[idx[size_t(i)]], idx[size_t(i)] / V, idx[size_t(i)] % V});
}

struct Beams {
  int64_t P, K;
  std::vector<float> score;                  // [P * K]
  std::vector<std::vector<int64_t>> tokens;  // [P * K] generated so far
  std::vector<RowHistory> hist;              // [P * K]
  std::vector<Hypotheses> hyps;              // [P]
  std::vector<bool> done;                    // [P]
  std::optional<detail::RowTexts> texts;     // [P * K] with stop strings
};

// Whether candidate `token` on row `row` ends its hypothesis.
bool ends(const Beams& st, int64_t row, int64_t token, const GenerationConfig& c) {
  if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), token) != c.eos_token_ids.end())
    return true;
  return st.texts && st.texts->would_stop(row, token);
}

// One step's selection for prompt p from logprob rows [K, V] (scores added).
void select(Beams& st, int64_t p, const float* scores, int64_t V, const GenerationConfig& c,
            std::vector<int64_t>& src_rows, std::vector<int64_t>& next_tok,
            std::vector<float>& next_score) {
  const int64_t K = st.K, cur = int64_t(st.tokens[size_t(p * K)].size()) + 1;
  if (st.done[size_t(p)]) {  // finished prompts idle on padding
    for (int64_t k = 0; k < K; ++k)
      src_rows[size_t(p * K + k)] = p * K, next_tok[size_t(p * K + k)] = c.pad_token_id,
                              next_score[size_t(p * K + k)] = 0.f;
    return;
  }
  // 2 x beams candidates leave beams live ones after up to beams end ids;
  // stop strings can end more, so the search widens until beams are live.
  const int64_t n_keep = std::max<int64_t>(2, 1 + int64_t(c.eos_token_ids.size())) * K;
  thread_local std::vector<Candidate> cand;
  cand.clear();
  int64_t filled = 0;
  for (size_t rank = 0; filled < K;) {
    if (rank == cand.size()) {
      if (int64_t(rank) == K * V) break;  // every candidate walked
      top_candidates(scores, K, V, std::min(rank == 0 ? n_keep : 2 * int64_t(rank), K * V), cand);
    }
    const Candidate& x = cand[rank++];
    const int64_t row = p * K + x.beam;
    if (ends(st, row, x.token, c)) {
      if (int64_t(rank) > K) continue;
      std::vector<int64_t> t = st.tokens[size_t(row)];
      t.push_back(x.token);
      st.hyps[size_t(p)].add(std::move(t), x.score, cur, c);
      continue;
    }
    src_rows[size_t(p * K + filled)] = row;
    next_tok[size_t(p * K + filled)] = x.token;
    next_score[size_t(p * K + filled)] = x.score;
    ++filled;
  }
  REDCO_CHECK(filled == K,
              "beam search: fewer than {} candidates neither end nor complete a stop string "
              "(a vocabulary smaller than num_beams, or stop strings matching every token?)",
              K);
  st.done[size_t(p)] = st.hyps[size_t(p)].is_done(cand.front().score, cur, c);
}

// Moves the beams to their chosen sources and appends the chosen tokens.
void advance_beams(Beams& st, const std::vector<int64_t>& src, const std::vector<int64_t>& tok,
                   const std::vector<float>& score) {
  std::vector<std::vector<int64_t>> tokens(st.tokens.size());
  std::vector<RowHistory> hist(st.hist.size());
  for (size_t r = 0; r < src.size(); ++r) {
    tokens[r] = st.tokens[size_t(src[r])];
    hist[r] = st.hist[size_t(src[r])];
    tokens[r].push_back(tok[r]);
    hist[r].push(tok[r], true);
  }
  st.tokens = std::move(tokens), st.hist = std::move(hist), st.score = score;
  if (st.texts) {
    st.texts->reorder(src);
    for (size_t r = 0; r < src.size(); ++r) st.texts->push(int64_t(r), tok[r]);
  }
}

// Prompt p's hypotheses, best first, its live beams among them when its
// search was cut short by max_new_tokens.
void settle(Beams& st, int64_t p, const GenerationConfig& c) {
  Hypotheses& h = st.hyps[size_t(p)];
  if (!st.done[size_t(p)])
    for (int64_t k = 0; k < st.K; ++k) {
      const auto& t = st.tokens[size_t(p * st.K + k)];
      h.add(t, st.score[size_t(p * st.K + k)], int64_t(t.size()), c);
    }
  st.done[size_t(p)] = true;
  std::stable_sort(h.best.begin(), h.best.end(),
                   [](const auto& a, const auto& b) { return a.score > b.score; });
}

// Streams the final sequences of each prompt whose search has ended and
// that has not streamed them yet (rows p * num_return_sequences + i).
void stream_done(Beams& st, const Prompts& prompts, const GenerationConfig& c,
                 const TextOptions& text, std::vector<bool>& sent) {
  if (!text.on_text) return;
  for (int64_t p = 0; p < st.P; ++p) {
    if (!st.done[size_t(p)] || sent[size_t(p)]) continue;
    settle(st, p, c);
    sent[size_t(p)] = true;
    for (int64_t i = 0; i < c.num_return_sequences; ++i)
      detail::stream_final(text, prompts[size_t(p)], st.hyps[size_t(p)].best[size_t(i)].tokens,
                           p * c.num_return_sequences + i);
  }
}

Generated finish(Beams& st, const GenerationConfig& c) {
  Generated out;
  for (int64_t p = 0; p < st.P; ++p) {
    const Hypotheses& h = st.hyps[size_t(p)];
    for (int64_t i = 0; i < c.num_return_sequences; ++i) {
      out.sequences.push_back(h.best[size_t(i)].tokens);
      out.scores.push_back(h.best[size_t(i)].score);
    }
  }
  return out;
}

// The beams of each prompt (rows p * K .. p * K + K - 1), one live to start.
Beams start(const Prompts& rows, int64_t P, int64_t K) {
  const int64_t R = P * K;
  Beams st{P,
           K,
           std::vector<float>(size_t(R), 0.f),
           Prompts(static_cast<size_t>(R)),
           std::vector<RowHistory>(static_cast<size_t>(R)),
           std::vector<Hypotheses>(size_t(P)),
           std::vector<bool>(size_t(P), false),
           std::nullopt};
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t t : rows[size_t(r)]) st.hist[size_t(r)].push(t, false);
    st.hist[size_t(r)].prompt_length = int64_t(rows[size_t(r)].size());
    if (r % K) st.score[size_t(r)] = -1e9f;  // one live beam to start: no duplicates
  }
  return st;
}

}  // namespace

Generated beam_search(const StepFn& step, const Prompts& prompts, const GenerationConfig& c,
                      nn::Ctx ctx, const TextOptions& text) {
  const int64_t P = int64_t(prompts.size()), K = c.num_beams, R = P * K;
  int64_t longest = 0;
  Prompts rows;
  for (const auto& p : prompts) {
    REDCO_CHECK(!p.empty(), "generate: a prompt is empty (it needs at least one token)");
    longest = std::max(longest, int64_t(p.size()));
    for (int64_t k = 0; k < K; ++k) rows.push_back(p);
  }
  Beams st = start(rows, P, K);
  const TextOptions quiet{.tokenizer = text.tokenizer,
                          .skip_special_tokens = text.skip_special_tokens};
  if (!c.stop_strings.empty()) st.texts.emplace(quiet, rows, c.stop_strings);
  std::vector<bool> sent(size_t(P), false);
  nn::KVCache cache(R, longest + c.max_new_tokens, c.cache_dtype);
  ctx.cache = &cache;  // its K rows per prompt share the prompt's encoder row
  auto [ids, logit_rows] = detail::prefill_input(rows, longest, c.pad_token_id);
  std::vector<int64_t> appended(static_cast<size_t>(R)), src(static_cast<size_t>(R)),
      tok(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) appended[size_t(r)] = int64_t(rows[size_t(r)].size());
  std::vector<float> score(static_cast<size_t>(R));
  Tensor next = Tensor::empty({R, 1}, DType::i64);
  for (int64_t s = 0; s < c.max_new_tokens; ++s) {
    Tensor logits = detail::run_step(step, ctx, cache, s == 0 ? ids : next, appended,
                                     s == 0 ? logit_rows : Tensor());
    const int64_t V = logits.dim(1);
    if (s == 0) check(c, V);  // the ids against the model's vocabulary
    float* lp = logits.data<float>();
    for (int64_t r = 0; r < R; ++r) {
      std::span<float> row(lp + r * V, size_t(V));
      REDCO_CHECK(log_softmax_inplace(row), "beam search: row {} has no finite logit (NaN?)", r);
      apply_processors(row, st.hist[size_t(r)], c);
      for (float& x : row) x += st.score[size_t(r)];
    }
    for (int64_t p = 0; p < P; ++p) select(st, p, lp + p * K * V, V, c, src, tok, score);
    advance_beams(st, src, tok, score);
    stream_done(st, prompts, c, text, sent);
    if (std::all_of(st.done.begin(), st.done.end(), [](bool d) { return d; })) break;
    cache.reorder(src, true);  // beams stay with their prompt: its encoder rows stay too
    std::copy(tok.begin(), tok.end(), next.data<int64_t>());
    std::fill(appended.begin(), appended.end(), 1);
  }
  for (int64_t p = 0; p < P; ++p)
    if (!sent[size_t(p)]) settle(st, p, c);
  stream_done(st, prompts, c, text, sent);
  return finish(st, c);
}

}  // namespace redco::generation
