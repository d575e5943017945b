#pragma once
// A model's per-call inputs, set on its context for one call and put back
// after it, even when the call throws. Entry points that take such inputs as
// arguments (models::bert_forward's token types, train::seq2seq_logits's
// encoder input, models::predict_noise's timesteps) use it, so the layers
// that read them from nn::Ctx see them for that call only:
//
//   nn::CallInputs<2> in(ctx, {{{&nn::Ctx::token_types, types}, {&nn::Ctx::mask, mask}}});
//   return model(ids);
#include <array>
#include <cstddef>
#include <utility>

#include "redco/nn/walk.hpp"

namespace redco::nn {

template <size_t N>
class CallInputs {
 public:
  using Field = Tensor Ctx::*;
  CallInputs(Ctx& ctx, std::array<std::pair<Field, Tensor>, N> set) : ctx_(ctx) {
    for (size_t i = 0; i < N; ++i) {
      fields_[i] = set[i].first;
      held_[i] = std::exchange(ctx.*fields_[i], std::move(set[i].second));
    }
  }
  ~CallInputs() {
    for (size_t i = 0; i < N; ++i) ctx_.*fields_[i] = std::move(held_[i]);
  }
  CallInputs(const CallInputs&) = delete;
  CallInputs& operator=(const CallInputs&) = delete;

 private:
  Ctx& ctx_;
  std::array<Field, N> fields_{};
  std::array<Tensor, N> held_{};  // what the context held before the call
};

}  // namespace redco::nn
