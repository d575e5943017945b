#pragma once
// models::CausalLM::Family for one typed decoder-only model. Included by
// causal_lm.cpp only, which is where each family's forward pass (and its
// backward, through the ops it records) is compiled: once, for every program.
#include <string>

#include "redco/models/causal_lm.hpp"
#include "redco/nn/model.hpp"

namespace redco::models::detail {

template <nn::Layer M, typename Config>
class FamilyOf final : public CausalLM::Family {
 public:
  using LayoutFn = hf::Layout (*)(const Config&);
  using JsonFn = io::Json (*)(const Config&, io::Json);

  FamilyOf(std::string name, const Config& c, M model, LayoutFn layout, JsonFn json)
      : name_(std::move(name)),
        config_(c),
        model_(std::move(model)),
        layout_(layout),
        json_(json) {}

  std::string_view name() const override { return name_; }
  int64_t vocab_size() const override { return config_.vocab; }
  int64_t max_positions() const override { return config_.context; }
  void walk(nn::Walker& w) const override { w.content<M>(&model_); }
  Tensor forward(const nn::Params& p, const Tensor& x, nn::Ctx& ctx) const override {
    return model_.forward(p.template content<M>(), x, ctx);  // as nn::apply runs M
  }
  hf::Layout layout() const override { return layout_(config_); }
  io::Json hf_config(io::Json base) const override { return json_(config_, std::move(base)); }

 private:
  std::string name_;
  Config config_;
  M model_;
  LayoutFn layout_;
  JsonFn json_;
};

template <nn::Layer M, typename Config>
CausalLM make_causal_lm(std::string name, const Config& c, M model,
                        hf::Layout (*layout)(const Config&),
                        io::Json (*json)(const Config&, io::Json)) {
  return CausalLM(std::make_shared<const FamilyOf<M, Config>>(std::move(name), c, std::move(model),
                                                              layout, json));
}

}  // namespace redco::models::detail
