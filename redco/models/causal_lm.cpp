#include "redco/models/causal_lm.hpp"

#include "redco/models/causal_lm_family.hpp"
#include "redco/models/pretrained.hpp"

namespace redco::models {

void CausalLM::check_fits(int64_t context, int64_t tokenizer_ids) const {
  const int64_t positions = max_positions();
  REDCO_CHECK(positions == 0 || context <= positions,
              "a context of {} tokens is longer than the {} model's {} positions: ask for at "
              "most {}",
              context, family(), positions, positions);
  REDCO_CHECK(tokenizer_ids <= vocab_size(),
              "the tokenizer has {} ids but the model's vocabulary has {}: use the tokenizer.json "
              "saved with the model",
              tokenizer_ids, vocab_size());
}

// Each family's forward pass behind models::CausalLM, compiled here once (and
// kept out of the families' .cpp files, which hold config and checkpoint code).
CausalLM causal_lm(const Gpt2Config& c) {
  return detail::make_causal_lm("gpt2", c, gpt2(c), gpt2_layout, gpt2_hf_config);
}

CausalLM causal_lm(const LlamaConfig& c) {
  return detail::make_causal_lm("llama", c, llama(c), llama_layout, llama_hf_config);
}

CausalLM causal_lm(const OptConfig& c) {
  return detail::make_causal_lm("opt", c, opt(c), opt_layout, opt_hf_config);
}

CausalLM causal_lm(const GptjConfig& c) {
  return detail::make_causal_lm("gptj", c, gptj(c), gptj_layout, gptj_hf_config);
}

CausalLM causal_lm(const GptNeoxConfig& c) {
  return detail::make_causal_lm("gpt_neox", c, gpt_neox(c), gpt_neox_layout, gpt_neox_hf_config);
}

CausalLM causal_lm(const hf::Config& config) {
  // with_family holds the one list of which family serves which model_type.
  return with_family<Gpt2, Llama, Opt, Gptj, GptNeox>(
      config.model_type(), config.source(),
      [&]<typename M>() { return causal_lm(HfFamily<M>::config(config)); });
}

}  // namespace redco::models
