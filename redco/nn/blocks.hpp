#pragma once
// Residual blocks in the arrangements real checkpoints use, chosen at run
// time so one model type loads every variant of a family:
//   normed_residual(norm, b, pre)   pre:  x + b(norm(x))        (GPT-2, OPT-125m)
//                                   post: norm(x + b(x))        (OPT-350m, BERT, BART)
//   parallel_residual(a, b, par)    par:  x + a(x) + b(x)       (GPT-NeoX, Pythia)
//                                   else: h = x + a(x); h + b(h)
//   maybe(l, on)                    l, or the identity when !on (a final norm
//                                   or projection only some configs have)
// (GPT-J's x + attn(ln(x)) + mlp(ln(x)) is residual(ln | attn + mlp).)
//
// Tensor parallelism: every arrangement enters its sub-blocks with whole
// features and leaves with whole features, so each attention or MLP inside
// keeps its own enter / all-reduce pair and the plan is the same whichever
// arrangement runs. Walks visit children in type order (norm before block),
// which is also the order of their names; the roles do not depend on it,
// since each child is a self-contained parallel block or a replicated norm.
#include "redco/nn/combinators.hpp"

namespace redco::nn {

template <Layer N, Layer B>
struct NormedResidual {
  static_assert(NamedNode<N>, "normed_residual: the norm must be a named layer (a norm)");
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  bool pre = true;
  N norm;
  B block;
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    f.template operator()<N>();
    f.template operator()<B>();
  }
  static constexpr void walk(Walker& w, const NormedResidual* r) {
    w.need_whole();
    w.child<N>(r ? &r->norm : nullptr);
    w.child<B>(r ? &r->block : nullptr);
    w.need_whole();
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    const Tensor in = whole_features(x, ctx);
    // The norm's scope name comes first whichever runs first.
    const Params pn = p.template child<N>([](const Params& q) { return q; });
    if (pre) return in + whole_features(apply_child(block, p, norm.forward(pn, in, ctx), ctx), ctx);
    const Tensor sum = in + whole_features(apply_child(block, p, in, ctx), ctx);
    return norm.forward(pn, sum, ctx);
  }
};

template <Layer A, Layer B>
struct ParallelResidual {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  bool parallel = true;
  A a;
  B b;
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    f.template operator()<A>();
    f.template operator()<B>();
  }
  static constexpr void walk(Walker& w, const ParallelResidual* r) {
    w.need_whole();
    w.child<A>(r ? &r->a : nullptr);
    w.need_whole();
    w.child<B>(r ? &r->b : nullptr);
    w.need_whole();
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    const Tensor in = whole_features(x, ctx);
    const Tensor ya = whole_features(apply_child(a, p, in, ctx), ctx);
    if (parallel) return in + ya + whole_features(apply_child(b, p, in, ctx), ctx);
    const Tensor h = in + ya;
    return h + whole_features(apply_child(b, p, h, ctx), ctx);
  }
};

// Named like the layer it holds; its parameters exist only when `on` (the
// compile-time plan, which sees no object, lists them).
template <Layer L>
struct Maybe {
  static_assert(NamedNode<L>, "maybe: the optional layer must be a named layer");
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = L::kName;
  bool on = true;
  L inner;
  static constexpr void walk(Walker& w, const Maybe* m) {
    if (!m || m->on) w.content<L>(m ? &m->inner : nullptr);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    return on ? inner.forward(p.template content<L>(), x, ctx) : x;
  }
};

template <Layer N, Layer B>
NormedResidual<N, B> normed_residual(N norm, B block, bool pre = true) {
  return {pre, std::move(norm), std::move(block)};
}
template <Layer A, Layer B>
ParallelResidual<A, B> parallel_residual(A a, B b, bool parallel = true) {
  return {parallel, std::move(a), std::move(b)};
}
template <Layer L>
Maybe<L> maybe(L l, bool on) {
  return {on, std::move(l)};
}

}  // namespace redco::nn
