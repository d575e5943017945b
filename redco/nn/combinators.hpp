#pragma once
// Combinators put a model's structure into its type:
//   a | b            sequence (nested sequences flatten)
//   a + b            both applied to the same input, outputs summed
//                    (token embedding + learned positions)
//   residual(b)      x + b(x)
//   repeat(n, b)     n copies of b with their own parameters: h.0, h.1, ...
//   named<"n">(l)    l under the name n instead of its default
//   encoder_decoder(e, d)  e reads ctx.source, d reads its input and attends to e's output
//   checkpoint(b)    b(x), its activations dropped after forward and recomputed
//                    in backward (training only; ctx.recompute does this for
//                    every repeat copy)
// Under tensor parallelism each gathers split features where its walk says
// need_whole (the residual add, the sum, between repeated copies).
#include <memory>
#include <tuple>

#include "redco/autodiff/checkpoint.hpp"
#include "redco/nn/layers.hpp"

namespace redco::nn {

template <typename L>
concept Layer = requires {
  L::kTransparent;
};

template <Layer C>
Tensor apply_child(const C& child, const Params& p, const Tensor& x, Ctx& ctx);

// The encoder output a KV cache holds (undefined before the first step).
const Tensor& cached_memory(const KVCache& cache);
const Tensor& cached_memory_mask(const KVCache& cache);
// Keeps the encoder output [S, Ts, d] and mask [S, Ts] for the cache's rows:
// each source serves batch / S consecutive rows (beams, return sequences),
// so the encoder runs once per source.
void cache_memory(KVCache& cache, const Tensor& memory, const Tensor& mask);

// body(p, x, ctx) under autodiff's checkpoint when training with a graph:
// backward replays it from x, the parameters and the forward context as they
// were on entry, so dropout draws the same masks (its keys are ctx's step and
// call counter). The parameter tree is copied (tensor handles only): the one
// the forward pass reads may be gone by backward (the Trainer's watched
// parameters). body is copied too, so it must not capture by reference.
template <typename F>
Tensor recomputed(const Params& p, const Tensor& x, Ctx& ctx, const F& body) {
  if (!ctx.train || ctx.cache || !GradMode::enabled()) return body(p, x, ctx);
  struct Entry {
    ParamTree tree;
    Params params;
    Ctx ctx;
    Tensor x;
  };
  auto entry = std::make_shared<Entry>(Entry{p.tree(), p, ctx, x});
  entry->params = p.rebound(entry->tree);
  return redco::checkpoint([&] { return body(p, x, ctx); },
                           [entry, body] {
                             Ctx c = entry->ctx;  // each replay starts from the entry state
                             return body(entry->params.rebound(entry->tree), entry->x, c);
                           });
}

template <Layer... Ls>
struct Seq {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  std::tuple<Ls...> layers;

  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    (f.template operator()<Ls>(), ...);
  }
  static constexpr void walk(Walker& w, const Seq* s) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      (w.child<Ls>(s ? &std::get<I>(s->layers) : nullptr), ...);
    }
    (std::index_sequence_for<Ls...>{});
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    Tensor h = x;
    std::apply([&](const auto&... l) { ((h = apply_child(l, p, h, ctx)), ...); }, layers);
    return h;
  }
};

template <Layer B>
struct Residual {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  B block;
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    f.template operator()<B>();
  }
  static constexpr void walk(Walker& w, const Residual* r) {
    w.need_whole();
    w.child<B>(r ? &r->block : nullptr);
    w.need_whole();  // the sum needs the block's whole output
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    const Tensor in = whole_features(x, ctx);
    return in + whole_features(apply_child(block, p, in, ctx), ctx);
  }
};

template <Layer A, Layer B>
struct Sum {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  A a;
  B b;
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    f.template operator()<A>();
    f.template operator()<B>();
  }
  static constexpr void walk(Walker& w, const Sum* s) {
    w.child<A>(s ? &s->a : nullptr);
    w.need_whole();
    w.child<B>(s ? &s->b : nullptr);
    w.need_whole();
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    const bool split_in = ctx.split_features;  // b reads the same input as a
    Tensor ya = whole_features(apply_child(a, p, x, ctx), ctx);
    ctx.split_features = split_in;
    return ya + whole_features(apply_child(b, p, x, ctx), ctx);
  }
};

template <Layer B>
struct Repeat {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "h";
  int64_t count = 0;
  B block;
  static constexpr void walk(Walker& w, const Repeat* r) {
    // Every copy starts and ends with whole features, so all copies share one plan.
    const auto one = [&] {
      w.need_whole();
      w.content<B>(r ? &r->block : nullptr);
      w.need_whole();
    };
    if (!r) return w.indexed(-1, one);
    for (int64_t i = 0; i < r->count; ++i) w.indexed(i, one);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    Tensor h = x;
    ctx.layer = 0;
    const auto copy = [block = block](const Params& q, const Tensor& in, Ctx& c) {
      return block.forward(q, in, c);
    };
    for (int64_t i = 0; i < count; ++i, ctx.layer = i) {
      const Params q = p.indexed(i).template content<B>();
      const Tensor in = whole_features(h, ctx);
      h = whole_features(ctx.recompute ? recomputed(q, in, ctx, copy) : copy(q, in, ctx), ctx);
    }
    return h;
  }
};

template <Layer B>
struct Checkpoint {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  B block;
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    f.template operator()<B>();
  }
  static constexpr void walk(Walker& w, const Checkpoint* c) {
    w.child<B>(c ? &c->block : nullptr);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    return recomputed(p, x, ctx, [block = block](const Params& q, const Tensor& in, Ctx& c) {
      return apply_child(block, q, in, c);
    });
  }
};

template <Literal N, Layer L>
struct Named {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = N.view();
  L inner;
  static constexpr void walk(Walker& w, const Named* n) { w.content<L>(n ? &n->inner : nullptr); }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    return inner.forward(p.template content<L>(), x, ctx);
  }
};

template <Layer E, Layer D>
struct EncoderDecoder {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  Named<"encoder", E> encoder;
  Named<"decoder", D> decoder;
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    f.template operator()<Named<"encoder", E>>();
    f.template operator()<Named<"decoder", D>>();
  }
  static constexpr void walk(Walker& w, const EncoderDecoder* m) {
    w.child<Named<"encoder", E>>(m ? &m->encoder : nullptr);
    w.need_whole();
    w.child<Named<"decoder", D>>(m ? &m->decoder : nullptr);
  }
  // x: decoder input ids [B, Tt]; ctx.source: encoder input ids [B, Ts].
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    REDCO_CHECK(ctx.source.defined(),
                "encoder_decoder: set ctx.source to the encoder's input ids before calling it");
    ctx.split_features = false;  // the encoder reads ids
    const Tensor target_mask = ctx.mask;
    ctx.mask = ctx.source_mask;
    // Generation runs the encoder once, on whole sources (without the cache,
    // which is the decoder's), and keeps its output and mask with the cache.
    KVCache* cache = ctx.cache;
    const bool cached = cache && cached_memory(*cache).defined();
    if (cached) {
      ctx.memory = cached_memory(*cache), ctx.memory_mask = cached_memory_mask(*cache);
      // Parameter names are scoped in child order: step past the encoder's.
      p.template child<Named<"encoder", E>>([](const Params&) { return 0; });
    } else {
      ctx.cache = nullptr;
      ctx.memory = whole_features(apply_child(encoder, p, ctx.source, ctx), ctx);
      ctx.cache = cache, ctx.memory_mask = ctx.source_mask;
      if (cache) {  // repeated for the rows each source serves
        cache_memory(*cache, ctx.memory, ctx.source_mask);
        ctx.memory = cached_memory(*cache), ctx.memory_mask = cached_memory_mask(*cache);
      }
    }
    ctx.mask = target_mask;
    Tensor y = apply_child(decoder, p, x, ctx);
    ctx.memory = Tensor(), ctx.memory_mask = Tensor();
    return y;
  }
};

// Runs a child of a transparent node in its scope.
template <Layer C>
inline Tensor apply_child(const C& child, const Params& p, const Tensor& x, Ctx& ctx) {
  return p.template child<C>([&](const Params& q) { return child.forward(q, x, ctx); });
}

// ---- building ----------------------------------------------------------------------------
namespace detail {
template <typename L>
struct AsSeq {
  using type = Seq<L>;
  static std::tuple<L> parts(L l) { return {std::move(l)}; }
};
template <typename... Ls>
struct AsSeq<Seq<Ls...>> {
  using type = Seq<Ls...>;
  static std::tuple<Ls...> parts(Seq<Ls...> s) { return std::move(s.layers); }
};
}  // namespace detail

template <Layer A, Layer B>
auto operator|(A a, B b) {
  auto parts =
      std::tuple_cat(detail::AsSeq<A>::parts(std::move(a)), detail::AsSeq<B>::parts(std::move(b)));
  return std::apply([](auto... ls) { return Seq<decltype(ls)...>{{std::move(ls)...}}; },
                    std::move(parts));
}
template <Layer A, Layer B>
Sum<A, B> operator+(A a, B b) {
  return {std::move(a), std::move(b)};
}
template <Layer B>
Residual<B> residual(B b) {
  return {std::move(b)};
}
template <Layer B>
Repeat<B> repeat(int64_t n, B b) {
  REDCO_CHECK(n >= 0, "repeat: the count must be >= 0, got {}", n);
  return {n, std::move(b)};
}
template <Layer B>
Checkpoint<B> checkpoint(B b) {
  return {std::move(b)};
}
template <Literal N, Layer L>
Named<N, L> named(L l) {
  return {std::move(l)};
}
template <Layer E, Layer D>
EncoderDecoder<E, D> encoder_decoder(E e, D d) {
  return {{std::move(e)}, {std::move(d)}};
}

}  // namespace redco::nn
