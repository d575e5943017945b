#pragma once
// Turning one row of next-token logits into a choice: penalties and bans
// (applied in transformers' order), then greedy, sampling warpers (temperature,
// top-k, top-p, min-p) with a Philox uniform, or log-probabilities for beams.
// Works on a caller's float row in place; scratch is reused across calls.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "redco/generation/generation_config.hpp"

namespace redco::generation {

// What a row has produced so far (prompt included), for penalties and n-gram bans.
struct RowHistory {
  std::vector<int64_t> tokens;  // prompt then generated
  int64_t prompt_length = 0;
  std::unordered_map<int64_t, int64_t> count;  // occurrences of each generated token
  void push(int64_t token, bool generated);
  int64_t generated() const { return int64_t(tokens.size()) - prompt_length; }
};

// Repetition / presence / frequency penalties, the n-gram ban and the early
// end-of-sequence ban, on logits (or log-probabilities, for beams, as
// transformers applies its processors there too).
void apply_processors(std::span<float> row, const RowHistory& h, const GenerationConfig& c);

class Sampler {
 public:
  // The chosen token: the first maximum when !c.do_sample, else a draw with
  // uniform u in [0, 1) after the warpers.
  int64_t choose(std::span<float> row, const GenerationConfig& c, float u);

 private:
  std::vector<float> prob_;
  std::vector<int64_t> order_;
};

int64_t first_argmax(std::span<const float> row);
// log_softmax in place; returns false if the row holds no finite value.
bool log_softmax_inplace(std::span<float> row);

}  // namespace redco::generation
