#pragma once
// What the memory and time models (plan/memory_model.hpp, plan/time_model.hpp)
// need of a model: its parameters with their tensor-parallel roles, taken from
// the typed model's own walk (so the planner and the run agree on every
// split), and the buffers each block keeps from forward to backward, per
// token, as the layers and autodiff ops of this library keep them.
//
//   ModelShape m = plan::model_shape(models::hf::Config("path/to/hf-folder"));
//
// The kept buffers are this library's, not a textbook's: an op that keeps its
// input for backward keeps that tensor (shared with whoever else keeps it,
// counted once); fused ops keep what their comment says (the GELU MLP keeps
// fc1's output only, the LM head no logits at all). tests/test_memory_model
// checks the sums against the caching allocator on every family here.
#include <cstdint>
#include <string>
#include <vector>

#include "redco/models/hf_checkpoint.hpp"
#include "redco/shard/split.hpp"

namespace redco::plan {

// One buffer a block keeps for backward: `width` elements per token.
struct Kept {
  std::string what = {};
  int64_t width = 0;
  // Inside the tensor-parallel region (heads, the MLP's hidden units): each
  // model shard keeps width / n_model_shards.
  bool split = false;
  // A product's operand that Precision::bf16 keeps rounded to bf16 (attention's
  // q, k, v; the GELU MLP's fc1 output): 2 bytes an element there, else 4.
  bool operand = false;
};

// A stack of identical blocks over one sequence (a decoder-only model has
// one; an encoder-decoder model an encoder over the source and a decoder
// over the target).
struct Stack {
  std::string name = {};
  int64_t layers = 0;
  bool over_source = false;  // runs over the source tokens (an encoder)
  // Each block's attention: query width (heads x head size) of its
  // self-attention, whether it is causal, and its cross-attention's query
  // width (0: none). For the FLOPs of attention's two products.
  int64_t self_width = 0;
  bool causal = true;
  int64_t cross_width = 0;
  // Tensor-parallel all-reduces per block and direction: one after each
  // split sublayer (attention, cross-attention, MLP), GPT-J's two parallel
  // branches summed first.
  int64_t reductions = 2;
  // f32 elements per token (inside the tensor-parallel region) that one
  // block's backward holds at its widest beyond what the block keeps: the
  // MLP's hidden gradients and its rule's temporaries (fused GELU: the
  // recomputed pre-activation and activation and the input gradient, 3 x
  // hidden; gated and other activations: 3 x and 2 x hidden).
  int64_t backward_width = 0;
  std::vector<Kept> per_token = {};         // each block, per token of its own sequence
  std::vector<Kept> per_source_token = {};  // each block, per source token (cross-attention's k, v)
  // T5's relative position bias [heads, T, T], computed once per stack and
  // kept by every attention in it (one buffer; its gradient another).
  int64_t score_bias_heads = 0;
  // Kept once per stack, per token (the embedding's output, the final norm's
  // input and output).
  std::vector<Kept> once_per_token = {};
};

struct ModelShape {
  std::string family = {};  // config.json's model_type
  int64_t vocab = 0, dim = 0;
  int64_t heads = 0;  // attention heads (the decoder's, for encoder-decoders)
  int64_t context =
      0;  // longest sequence a learned position table holds; 0: none (rotary, relative)
  bool encoder_decoder = false;
  // The LM head's logits: false when the head runs as one op with the loss,
  // a chunk of rows at a time (redco's default), true when they are formed
  // whole (a head with a bias, GPT-J's).
  bool whole_logits = false;
  // > 0: a sequence classifier (BERT, RoBERTa): a pooler and this many
  // classes over each row's first token instead of an LM head.
  int64_t classes = 0;
  std::vector<Stack> stacks = {};
  // Every parameter, whole, with the dimension the plan cuts for a given
  // number of model shards (filled by resolve()).
  std::vector<nn::ParamEntry> entries = {};
  int64_t n_params() const;
  // The LM head reads the token embedding's table (one [vocab, d] parameter
  // cut by vocabulary, not two).
  bool tied_head() const;
  // The plan for n model shards (shard::resolve on the entries).
  std::vector<shard::ParamSplit> resolve(int n_model_shards) const;
};

// From a Hugging Face config (config.json's model_type picks the family:
// gpt2, llama (also mistral, qwen2), opt, gptj, gpt_neox, t5, bart; bert and
// roberta as sequence classifiers of num_labels classes). Fails
// naming the model_type when it is none of those.
ModelShape model_shape(const models::hf::Config& config);

// The families model_shape() takes.
std::vector<std::string> planned_families();

}  // namespace redco::plan
