#pragma once
// Layers of the encoder and encoder-decoder families (T5, BART): a relative
// position bias shared by a stack of attention layers, a token embedding that
// reads another layer's table, a constant scale, T5's feed-forward block
// (plain or gated), a bias on the logits, BERT's token types, RoBERTa's
// positions and the first token of a sequence. Post-LN blocks need no layer of their own:
// residual(f) | norm. Shapes as in layers.hpp: activations [B, T, d].
#include "redco/nn/combinators.hpp"

namespace redco::nn {

// T5's bucketed relative position bias (Raffel et al., 2020, section 2.1).
// The table [buckets, heads] maps the bucket of (key position - query
// position) to one bias per head; this layer looks the buckets of a
// [Tq, Tk] grid up (an embedding lookup, so the table gets its gradient) and
// leaves the bias [heads, Tq, Tk] in ctx.score_bias for the attention layers
// after it (Attention::score_bias), passing its input through. Bidirectional
// (an encoder): half the buckets for keys after the query. Otherwise (a
// causal decoder) keys after the query share bucket 0. Half of each side's
// buckets are exact distances, the rest logarithmic up to max_distance.
// Tensor-parallel: the table is split by heads (Role::head_table), so each
// rank computes the bias of the heads its attention layers hold. With a KV
// cache (generation, causal only) each row's queries sit at their own
// positions: the bias is [B, heads, Tq, cache capacity], one per row.
struct RelativePositionBias {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "relative_attention_bias";
  int64_t buckets = 32, max_distance = 128, heads = 0;
  bool bidirectional = true;
  static constexpr void walk(Walker& w, const RelativePositionBias* l) {
    w.new_group();
    w.param("weight", Role::head_table, l ? Dims{l->buckets, l->heads} : Dims{}, Init::normal,
            kTransformerInitStd);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const;
};

// The bucket of each (query i, key j) pair, i64 [Tq, Tk]: the lookup
// RelativePositionBias makes (transformers' _relative_position_bucket).
Tensor relative_position_buckets(int64_t tq, int64_t tk, int64_t buckets, int64_t max_distance,
                                 bool bidirectional);

// A token embedding whose table is another layer's parameter (`table`, a
// root name such as "encoder.embed_tokens.weight"): a decoder sharing its
// encoder's vocabulary. It owns no parameter; the table keeps the role its
// owner declares (vocabulary split).
struct SharedEmbedding {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  int64_t vocab = 0;
  const char* table = nullptr;
  static constexpr void walk(Walker& w, const SharedEmbedding*) {
    w.need_whole();
    w.add_collective(Collective::all_reduce);  // each shard looks up its slice of the vocabulary
  }
  Tensor forward(const Params& p, const Tensor& ids, Ctx& ctx) const {
    // The owner of the table checked its shard's shape.
    return parallel_embedding(p.at_root(table), p.split_at_root(table), ids, ctx);
  }
};

// x * factor: T5's d_model**-0.5 before a tied LM head, BART's sqrt(d_model)
// on embeddings. Elementwise, so it works on split features too.
struct Scale {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  float factor = 1.f;
  static constexpr void walk(Walker&, const Scale*) {}
  Tensor forward(const Params&, const Tensor& x, Ctx&) const {
    return factor == 1.f ? x : mul(x, factor);
  }
};

// T5's feed-forward block, without biases: wo(act(wi x)), or with `gated`
// wo(act(wi_0 x) * wi_1 x) (T5 v1.1's gated-gelu). wi (wi_0, wi_1) are
// column-parallel, wo row-parallel: one all-reduce leaving the block.
struct DenseActDense {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "DenseReluDense";
  int64_t dim = 0, hidden = 0;
  Act act = Act::relu;
  bool gated = false;
  static constexpr void walk(Walker& w, const DenseActDense* l) {
    w.begin_block();
    const Dims in = l ? Dims{l->hidden, l->dim} : Dims{};
    if (l && !l->gated) {
      w.param("wi.weight", Role::column, in, Init::normal, kTransformerInitStd);
    } else {  // the compile-time plan lists the gated form's names
      w.param("wi_0.weight", Role::column, in, Init::normal, kTransformerInitStd);
      w.param("wi_1.weight", Role::column, in, Init::normal, kTransformerInitStd);
    }
    w.param("wo.weight", Role::row, l ? Dims{l->dim, l->hidden} : Dims{}, Init::normal,
            kTransformerInitStd);
    w.end_block();
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const;
};

// logits + bias (BART's final_logits_bias) after an LM head. The bias is
// stored [vocab, 1] (a checkpoint's [1, vocab], transposed) so that it splits
// by vocabulary along dim 0 like the head's table: each rank adds its slice
// to its slice of the logits.
struct LogitBias {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  int64_t vocab = 0;
  static constexpr void walk(Walker& w, const LogitBias* l) {
    w.new_group();
    w.param("final_logits_bias", Role::vocab, l ? Dims{l->vocab, 1} : Dims{}, Init::zeros);
  }
  Tensor forward(const Params& p, const Tensor& logits, Ctx& ctx) const;
};

// BERT's segment embedding: rows of the table [types, d] picked by
// ctx.token_types [B, T] (i64), or row 0 for every token when it is undefined.
struct TokenTypeEmbedding {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "token_type_embeddings";
  int64_t types = 2, dim = 0;
  static constexpr void walk(Walker& w, const TokenTypeEmbedding* l) {
    w.param("weight", Role::replicated, l ? Dims{l->types, l->dim} : Dims{}, Init::normal,
            kTransformerInitStd);
  }
  Tensor forward(const Params& p, const Tensor& ids, Ctx& ctx) const;
};

// RoBERTa's learned positions: numbered from pad + 1 over the tokens that are
// not `pad`, and pad itself for the padding tokens (transformers'
// create_position_ids_from_input_ids). ids [B, T] -> [B, T, d].
struct PaddedPositions {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "position_embeddings";
  int64_t max_len = 0, dim = 0, pad = 1;
  static constexpr void walk(Walker& w, const PaddedPositions* l) {
    w.param("weight", Role::replicated, l ? Dims{l->max_len, l->dim} : Dims{}, Init::normal,
            kTransformerInitStd);
  }
  Tensor forward(const Params& p, const Tensor& ids, Ctx& ctx) const;
};

// x[:, 0] ([B, T, d] -> [B, d]): the first ([CLS]) token, read by BERT's
// pooler and RoBERTa's classification head. Works on split features too.
struct FirstToken {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  static constexpr void walk(Walker&, const FirstToken*) {}
  Tensor forward(const Params&, const Tensor& x, Ctx&) const {
    REDCO_CHECK(x.rank() == 3, "first token: expected [batch, seq, d], got {}", x.shape());
    return reshape(slice(x, 1, 0, 1), {x.dim(0), x.dim(2)});
  }
};

// The encoder's output [B, Ts, d] alone (whole features), for the source ids
// [B, Ts] and ctx.source_mask: what an encoder-decoder's cross-attention
// reads (transformers' encoder_last_hidden_state).
template <Layer E, Layer D>
Tensor encode(const EncoderDecoder<E, D>& m, const ParamTree& params, const Tensor& source,
              Ctx& ctx) {
  ctx.split_features = false;
  const Tensor mask = ctx.mask;
  ctx.mask = ctx.source_mask;
  const Params root = Params(params, split_table(m, ctx)).content<EncoderDecoder<E, D>>();
  Tensor h = whole_features(apply_child(m.encoder, root, source, ctx), ctx);
  ctx.mask = mask;
  return h;
}

inline RelativePositionBias relative_position_bias(int64_t heads, int64_t buckets,
                                                   int64_t max_distance, bool bidirectional) {
  return {.buckets = buckets,
          .max_distance = max_distance,
          .heads = heads,
          .bidirectional = bidirectional};
}
inline SharedEmbedding shared_embedding(int64_t vocab, const char* table) {
  return {.vocab = vocab, .table = table};
}
inline Scale scale(float factor) { return {.factor = factor}; }
inline LogitBias logit_bias(int64_t vocab) { return {.vocab = vocab}; }
inline TokenTypeEmbedding token_type_embedding(int64_t types, int64_t dim) {
  return {.types = types, .dim = dim};
}
inline PaddedPositions padded_positions(int64_t max_len, int64_t dim, int64_t pad) {
  return {.max_len = max_len, .dim = dim, .pad = pad};
}
inline FirstToken first_token() { return {}; }
inline DenseActDense dense_act_dense(int64_t dim, int64_t hidden, Act act, bool gated) {
  return {.dim = dim, .hidden = hidden, .act = act, .gated = gated};
}

}  // namespace redco::nn
