// The run-time parts of the DSL: parameter lookup, initialisation and the
// forward passes too long to sit in the headers.
#include <fmt/format.h>

#include "redco/nn/model.hpp"

namespace redco::nn {

Name Params::next_scope_name() const {
  REDCO_CHECK(*pos_ < scope_size_,
              "model scope '{}' has {} named layers, but the forward pass asked for more",
              path_.view(), scope_size_);
  return scope_[(*pos_)++];
}

const Tensor& Params::operator[](std::string_view leaf) const {
  return at_root(path_.dot(leaf).view());
}

const Tensor& Params::at_root(std::string_view name) const {
  auto it = tree_->find(std::string(name));
  REDCO_CHECK(it != tree_->end(),
              "parameter '{}' is missing from the parameter tree ({} entries); build it with "
              "nn::init_params(model, seed) or load a checkpoint of this model",
              name, tree_->size());
  return it->second;
}

Tensor init_param(const ParamEntry& e, uint64_t seed) {
  const Shape shape = e.shape.shape();
  switch (e.init) {
    case Init::normal:
      return Tensor::normal(shape, seed, stream_of(e.name.view()), 0.f, e.init_std);
    case Init::ones:
      return Tensor::ones(shape);
    case Init::zeros:
      break;
  }
  return Tensor::zeros(shape);
}

int64_t count_parameters(const ParamTree& params) {
  int64_t n = 0;
  for (const auto& [name, p] : params) n += p.numel();
  return n;
}

void check_params(const std::vector<ParamEntry>& expected, const ParamTree& params) {
  for (const ParamEntry& e : expected) {
    const std::string name(e.name.view());
    auto it = params.find(name);
    REDCO_CHECK(it != params.end(), "parameter '{}' (shape {}) is missing", name, e.shape.shape());
    REDCO_CHECK(it->second.shape() == e.shape.shape(),
                "parameter '{}' has shape {} but the model needs {}", name, it->second.shape(),
                e.shape.shape());
  }
  REDCO_CHECK(params.size() == expected.size(),
              "the parameter tree has {} entries but the model has {} parameters", params.size(),
              expected.size());
}

Tensor activate(Act a, const Tensor& x) {
  switch (a) {
    case Act::relu:
      return relu(x);
    case Act::gelu:
      return gelu(x, true);
    case Act::gelu_erf:
      return gelu(x, false);
    case Act::silu:
      return silu(x);
    case Act::tanh:
      return tanh(x);
  }
  return x;
}

Tensor Positions::forward(const Params& p, const Tensor& ids, Ctx&) const {
  REDCO_CHECK(ids.rank() >= 1, "positions: expected ids [batch, seq], got {}", ids.shape());
  const int64_t T = ids.dim(-1);
  REDCO_CHECK(T <= max_len, "positions: sequence length {} exceeds the model's maximum {}", T,
              max_len);
  return slice(p["weight"], 0, 0, T);  // [T, d], broadcast over the batch
}

template <bool Bias, bool Cross>
Tensor Attention<Bias, Cross>::project(const Params& p, const char* name, const Tensor& x,
                                       int64_t n_heads) const {
  const std::string proj(name);
  Tensor y = linear(x, p[proj + ".weight"], Bias ? p[proj + ".bias"] : Tensor());  // [B, T, h*hd]
  return transpose(reshape(y, {x.dim(0), x.dim(1), n_heads, head_dim()}), 1, 2);   // [B, h, T, hd]
}

template <bool Bias, bool Cross>
Tensor Attention<Bias, Cross>::forward(const Params& p, const Tensor& x, Ctx& ctx) const {
  REDCO_CHECK(x.rank() == 3 && x.dim(2) == dim, "{}: expected input [batch, seq, {}], got {}",
              p.path().view(), dim, x.shape());
  const Tensor& kv_in = Cross ? ctx.memory : x;
  REDCO_CHECK(kv_in.defined(), "{}: cross-attention needs the encoder output (ctx.memory)",
              p.path().view());
  Tensor q = project(p, "q_proj", x, heads);
  Tensor k = project(p, "k_proj", kv_in, kv_heads);
  Tensor v = project(p, "v_proj", kv_in, kv_heads);
  if (rotary) {
    q = redco::rotary(q, 0, rope_base);
    k = redco::rotary(k, 0, rope_base);
  }
  Tensor o = transpose(attention(q, k, v, causal), 1, 2);  // [B, T, heads, hd]
  return linear(reshape(o, {x.dim(0), x.dim(1), dim}), p["o_proj.weight"],
                Bias ? p["o_proj.bias"] : Tensor());
}

template struct Attention<true, false>;
template struct Attention<false, false>;
template struct Attention<true, true>;
template struct Attention<false, true>;

}  // namespace redco::nn
