#pragma once
// A named collection of models trained together: actor and critic, online
// and target networks, a base model and its adapters, a denoiser and a text
// encoder. The collection is one typed expression, so its parameter names,
// initial values and tensor-parallel plan come from the same walk as any
// other model's:
//
//   auto ac = nn::parts(nn::named<"actor">(nn::linear(4, 64) | nn::tanh() | nn::linear(64, 2)),
//                       nn::named<"critic">(nn::linear(4, 64) | nn::tanh() | nn::linear(64, 1)));
//   // parameters: actor.0.weight, ..., critic.2.bias
//
// Each part's parameters sit under its name. Each part starts with whole
// features, so the two sharding rules restart in every part: a part's plan
// is the plan it would have alone, under its name (shard::resolve(ac, n)).
// A collection has no forward pass of its own: a loss runs its parts by name
// (train::BoundModel::part<"actor">(), checked at compile time), and
// nn::apply_part does the same outside the Trainer.
#include <string_view>
#include <tuple>

#include "redco/nn/model.hpp"

namespace redco::nn {

template <typename T>
struct is_named : std::false_type {};
template <Literal N, Layer L>
struct is_named<Named<N, L>> : std::true_type {};

namespace detail {
template <typename... Ps>
constexpr bool unique_names() {
  constexpr std::string_view names[] = {Ps::kName...};
  for (size_t i = 0; i < sizeof...(Ps); ++i)
    for (size_t j = 0; j < i; ++j)
      if (names[i] == names[j]) return false;
  return true;
}
}  // namespace detail

template <Layer... Ps>
struct Parts {
  static_assert(sizeof...(Ps) > 0 && (is_named<Ps>::value && ...),
                "redco: nn::parts takes nn::named<\"name\">(model) arguments");
  static_assert(detail::unique_names<Ps...>(), "redco: the parts of nn::parts need distinct names");
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  std::tuple<Ps...> parts;

  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    (f.template operator()<Ps>(), ...);
  }
  static constexpr void walk(Walker& w, const Parts* s) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((w.need_whole(), w.child<Ps>(s ? &std::get<I>(s->parts) : nullptr)), ...);
    }
    (std::index_sequence_for<Ps...>{});
    w.need_whole();
  }

  // The index of the part named N, or sizeof...(Ps) when there is none.
  template <Literal N>
  static constexpr size_t index_of() {
    constexpr std::string_view names[] = {Ps::kName...};
    for (size_t i = 0; i < sizeof...(Ps); ++i)
      if (names[i] == N.view()) return i;
    return sizeof...(Ps);
  }
  template <Literal N>
  static constexpr bool has = index_of<N>() < sizeof...(Ps);
  // The model of the part named N.
  template <Literal N>
  const auto& get() const {
    static_assert(has<N>, "redco: nn::parts has no part of this name");
    return std::get<index_of<N>()>(parts).inner;
  }
};

template <typename T>
struct is_parts : std::false_type {};
template <typename... Ps>
struct is_parts<Parts<Ps...>> : std::true_type {};

template <Layer... Ps>
Parts<Ps...> parts(Ps... ps) {
  return {{std::move(ps)...}};
}

// Runs a model whose parameters sit under `root` in `params`, as nn::apply
// runs a whole one.
template <Layer L>
Tensor apply_at(const L& model, const ParamTree& params, const Name& root, const Tensor& x,
                Ctx& ctx) {
  ctx.split_features = false;
  const Params p(params, root, split_table(model, ctx));
  return finish_output(model.forward(p.content<L>(), x, ctx), ctx);
}

// Runs part N of a collection on the collection's parameters.
template <Literal N, typename... Ps>
Tensor apply_part(const Parts<Ps...>& model, const ParamTree& params, const Tensor& x, Ctx& ctx) {
  return apply_at(model.template get<N>(), params, Name(N.view()), x, ctx);
}

}  // namespace redco::nn
