#pragma once
// The `model` a user's loss and predict functions receive: the typed layer
// expression bound to the parameters of the current step and to a forward
// context (training or evaluation, the dropout stream). `model(x)` runs
// nn::apply; the user never handles parameter trees or contexts.
#include <utility>

#include "redco/nn/model.hpp"

namespace redco::train {

template <nn::Layer L>
class BoundModel {
 public:
  BoundModel(const L& layer, const nn::ParamTree& params, nn::Ctx ctx)
      : layer_(&layer), params_(&params), ctx_(std::move(ctx)) {}

  // One forward pass. The context is shared by the calls of one step, so a
  // model applied twice in a loss draws different dropout masks each time
  // (ctx.dropout_calls counts them), and the same ones on every rerun.
  Tensor operator()(const Tensor& x) { return nn::apply(*layer_, *params_, x, ctx_); }
  // A padded batch: `mask` [B, T] is 1 for a token and 0 for padding (Hugging
  // Face's attention_mask; data::TextBatch::mask), for this call only.
  Tensor operator()(const Tensor& x, const Tensor& mask) {
    ctx_.mask = mask;
    Tensor y = nn::apply(*layer_, *params_, x, ctx_);
    ctx_.mask = Tensor();
    return y;
  }

  // For library code that needs the pieces (generation, encoder-decoder
  // inputs through ctx().source).
  const L& layer() const { return *layer_; }
  const nn::ParamTree& params() const { return *params_; }
  nn::Ctx& ctx() { return ctx_; }
  bool training() const { return ctx_.train; }

 private:
  const L* layer_;
  const nn::ParamTree* params_;
  nn::Ctx ctx_;
};

}  // namespace redco::train
