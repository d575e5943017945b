#pragma once
// The `model` a user's loss and predict functions receive: the typed layer
// expression bound to the parameters of the current step and to a forward
// context (training or evaluation, the dropout stream). `model(x)` runs
// nn::apply; the user never handles parameter trees or contexts.
//
// A collection of models (nn::parts) is run by part: model.part<"actor">()
// is the actor bound to the same parameters and context (a name that is not
// a part does not compile). model.with(params) is the same model bound to
// other parameters (MAML's adapted weights, a FedAvg client's local copy):
// a tree with the same names, this rank's shards under model parallelism.
#include <utility>

#include "redco/nn/ctx_inputs.hpp"
#include "redco/nn/model.hpp"
#include "redco/nn/parts.hpp"

namespace redco::train {

#define REDCO_NOT_PARTS_MESSAGE \
  "redco: part<\"name\">(model) needs a model built with nn::parts(nn::named<\"name\">(...), ...)"
#define REDCO_NO_PART_MESSAGE "redco: part<\"name\">(model): the model has no part of that name"

// What part<N>() returns after its compile error, so that one error is all
// the compiler reports.
struct NoPart {
  Tensor operator()(const Tensor&) const { return {}; }
};

template <nn::Layer L>
class BoundModel {
 public:
  BoundModel(const L& layer, const nn::ParamTree& params, nn::Ctx ctx)
      : layer_(&layer), params_(&params), own_(std::move(ctx)) {}
  // A view sharing another model's context (a part, or other parameters).
  BoundModel(const L& layer, const nn::ParamTree& params, const nn::Name& root, nn::Ctx& shared)
      : layer_(&layer), params_(&params), root_(root), shared_(&shared) {}

  // One forward pass. The context is shared by the calls of one step, so a
  // model applied twice in a loss draws different dropout masks each time
  // (ctx.dropout_calls counts them), and the same ones on every rerun.
  Tensor operator()(const Tensor& x) {
    if (root_.size() == 0) return nn::apply(*layer_, *params_, x, ctx());
    return nn::apply_at(*layer_, *params_, root_, x, ctx());
  }
  // A padded batch: `mask` [B, T] is 1 for a token and 0 for padding (Hugging
  // Face's attention_mask; data::TextBatch::mask), for this call only.
  Tensor operator()(const Tensor& x, const Tensor& mask) {
    const nn::CallInputs<1> in(ctx(), {{{&nn::Ctx::mask, mask}}});
    return (*this)(x);
  }

  // Part N of a collection (nn::parts), bound to the same parameters and
  // context. A model that is not a collection, or a name that is not a part,
  // is one compile error naming the mistake.
  template <nn::Literal N>
  auto part() {
    if constexpr (!nn::is_parts<L>::value) {
      static_assert(nn::is_parts<L>::value, REDCO_NOT_PARTS_MESSAGE);
      return NoPart{};
    } else if constexpr (!L::template has<N>) {
      static_assert(L::template has<N>, REDCO_NO_PART_MESSAGE);
      return NoPart{};
    } else {
      using P = std::remove_cvref_t<decltype(layer_->template get<N>())>;
      return BoundModel<P>(layer_->template get<N>(), *params_, root_.dot(N.view()), ctx());
    }
  }
  // This model bound to `params` (the same names), sharing the context.
  BoundModel with(const nn::ParamTree& params) { return BoundModel(*layer_, params, root_, ctx()); }

  // For library code that needs the pieces (generation, encoder-decoder
  // inputs through ctx().source).
  const L& layer() const { return *layer_; }
  const nn::ParamTree& params() const { return *params_; }
  const nn::Name& root() const { return root_; }  // empty unless a part
  nn::Ctx& ctx() { return shared_ ? *shared_ : own_; }
  bool training() const { return shared_ ? shared_->train : own_.train; }

 private:
  const L* layer_;
  const nn::ParamTree* params_;
  nn::Name root_;
  nn::Ctx own_;
  nn::Ctx* shared_ = nullptr;  // set: a view using another model's context
};

}  // namespace redco::train

namespace redco::train {

// part<"actor">(model): model.part<"actor">() without the `template` keyword a
// generic lambda's `auto& model` would need.
template <nn::Literal N, nn::Layer L>
auto part(BoundModel<L>& model) {
  return model.template part<N>();
}

}  // namespace redco::train
