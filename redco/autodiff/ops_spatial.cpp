// Differentiable ops over positions and pixels: embedding, rotary positions,
// attention, convolution and pooling. The linear ones (embedding's scatter,
// rotary, pooling backward) form closed families: the gradient of each
// backward op is the forward op again, so any order of derivative works.
#include <array>
#include <cmath>

#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {
using detail::building_higher_order;
using detail::reference_vjp;

// ---- embedding: gather forward, scatter-add backward -------------------------------------
namespace {
Tensor embedding_scatter(const Tensor& dout, const Tensor& ids, int64_t vocab) {
  return record(
      "embedding_scatter", {dout}, kernels::embedding_backward(dout, ids, vocab, Tensor()),
      [ids](const Node&, const TensorList& g) { return TensorList{embedding(g[0], ids)}; });
}
}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids) {
  return record("embedding", {table}, kernels::embedding(table, ids),
                [ids, vocab = table.dim(0)](const Node& self, const TensorList& g) {
                  if (building_higher_order())
                    return TensorList{embedding_scatter(g[0], ids, vocab)};
                  // The table's gradient summed so far (a tied LM head's) takes
                  // the rows in place: no second [vocab, dim] buffer (154 MB on GPT-2).
                  Tensor into = detail::take_pending_grad(self, 0);
                  return TensorList{kernels::embedding_backward(g[0], ids, vocab, into)};
                });
}

// ---- rotary: a rotation, so its adjoint is the inverse rotation ------------------------------
namespace {
Tensor rotate(const Tensor& x, int64_t pos_offset, float base, bool inverse) {
  return record("rotary", {x}, kernels::rotary(x, pos_offset, base, inverse),
                [pos_offset, base, inverse](const Node&, const TensorList& g) {
                  return TensorList{rotate(g[0], pos_offset, base, !inverse)};
                });
}
}  // namespace

Tensor rotary(const Tensor& x, int64_t pos_offset, float base) {
  return rotate(x, pos_offset, base, false);
}

// ---- attention ---------------------------------------------------------------------------------
namespace {
float attention_scale(const Tensor& q, float scale) {
  return scale < 0.f ? 1.f / std::sqrt(float(q.shape().last())) : scale;
}
}  // namespace

namespace {
// The additive mask of causality and key ranges [B or 1, 1, Tq, Tk] (-1e30
// where a query may not look), and [B or 1, 1, Tq, 1]: 1 where a query sees
// some key (the fused kernel's output is 0 for the others).
std::pair<Tensor, Tensor> reference_masks(int64_t B, int64_t Tq, int64_t Tk, bool causal,
                                          const AttentionExtras& x) {
  const int64_t rows = x.key_begin.defined() || x.causal_offset.defined() ? B : 1;
  Tensor mask = Tensor::zeros({rows, 1, Tq, Tk}), seen = Tensor::zeros({rows, 1, Tq, 1});
  float *m = mask.data<float>(), *s = seen.data<float>();
  // The key ranges live with q; the masks are built on the host from copies.
  auto host = [](const Tensor& t) { return t.defined() ? t.to(Device::cpu()) : t; };
  const Tensor begin = host(x.key_begin), end_of = host(x.key_end), offset = host(x.causal_offset);
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t lo = begin.defined() ? begin.data<int64_t>()[b] : 0;
    const int64_t hi = end_of.defined() ? end_of.data<int64_t>()[b] : Tk;
    const int64_t off = offset.defined() ? offset.data<int64_t>()[b] : Tk - Tq;
    for (int64_t i = 0; i < Tq; ++i) {
      // Query i sits at position i + off and sees keys up to there.
      const int64_t end = causal ? std::min(hi, i + off + 1) : hi;
      for (int64_t j = 0; j < Tk; ++j)
        if (j < lo || j >= end) m[(b * Tq + i) * Tk + j] = -1e30f;
      s[b * Tq + i] = end > lo ? 1.f : 0.f;
    }
  }
  return {mask, seen};
}
}  // namespace

Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                           float scale, const AttentionExtras& extras) {
  REDCO_CHECK(q.rank() == 4 && k.rank() == 4 && k.shape() == v.shape() && k.dim(1) > 0 &&
                  q.dim(1) % k.dim(1) == 0,
              "attention: expected q [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D]; got q {}, k {}, v {}",
              q.shape(), k.shape(), v.shape());
  const int64_t B = q.dim(0), Hq = q.dim(1), Hkv = k.dim(1), Tq = q.dim(2), Tk = k.dim(2);
  auto repeat_heads = [&](const Tensor& t) {  // [B, Hkv, Tk, D] -> [B, Hq, Tk, D]
    if (Hq == Hkv) return t;
    const int64_t D = t.dim(3);
    Tensor r = broadcast_to(reshape(t, {B, Hkv, 1, Tk, D}), {B, Hkv, Hq / Hkv, Tk, D});
    return reshape(r, {B, Hq, Tk, D});
  };
  Tensor scores =
      matmul(q, repeat_heads(k), false, true) * attention_scale(q, scale);  // [B,Hq,Tq,Tk]
  if (extras.bias.defined()) scores = scores + extras.bias;
  if (!causal && !extras.key_begin.defined() && !extras.causal_offset.defined())
    return matmul(softmax(scores), repeat_heads(v));
  auto [mask, seen] = reference_masks(B, Tq, Tk, causal, extras);
  if (!q.device().is_cpu()) mask = mask.to(q.device()), seen = seen.to(q.device());
  return matmul(softmax(scores + mask), repeat_heads(v)) * seen;
}

namespace {
// The inputs attention records: q, k, v and the bias when there is one.
TensorList attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionExtras& x) {
  return x.bias.defined() ? TensorList{q, k, v, x.bias} : TensorList{q, k, v};
}
// What attention computes with and keeps for backward: the inputs, or under
// Precision::bf16 q, k and v rounded to bf16 (its products are matrix
// products: bf16 operands, f32 accumulation, as a bf16 GEMM). Kept as bf16
// they take half the bytes of the three activations a block saves for
// attention; the f32 inputs are not held. Gradients flow to the inputs as
// through any mixed-precision product (the rounding passes them unchanged).
TensorList attention_operands(const TensorList& inputs) {
  if (matmul_precision() != Precision::bf16) return inputs;
  TensorList out = inputs;
  for (size_t i = 0; i < 3; ++i) out[i] = inputs[i].detach().to(DType::bf16);
  return out;
}
// Second-order gradients need the graph-connected f32 inputs, which
// Precision::bf16 does not keep.
void check_not_higher_order(const TensorList& kept) {
  REDCO_CHECK(kept[0].dtype() != DType::bf16,
              "attention: gradients of gradients (create_graph) through attention recorded under "
              "Precision::bf16 are not supported; record it under Precision::f32");
}
// The extras with the bias taken from the (higher-order) inputs.
AttentionExtras with_bias(const AttentionExtras& x, const TensorList& in) {
  AttentionExtras y = x;
  if (in.size() > 3) y.bias = in[3];
  return y;
}
}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale_in,
                 const AttentionExtras& extras) {
  const float scale = attention_scale(q, scale_in);
  auto lse = std::make_shared<Tensor>();
  const TensorList inputs = attention_inputs(q, k, v, extras);
  const TensorList kept = attention_operands(inputs);
  Tensor o = kernels::attention(kept[0], kept[1], kept[2], causal, scale, *lse, extras);
  auto saved_o = std::make_shared<Tensor>(o.detach());
  return record("attention", inputs, o,
                [kept, extras, causal, scale, lse, saved_o](const Node& self, const TensorList& g) {
                  if (building_higher_order()) {
                    check_not_higher_order(kept);
                    return reference_vjp(self, kept, g[0], [&](const TensorList& in) {
                      return attention_reference(in[0], in[1], in[2], causal, scale,
                                                 with_bias(extras, in));
                    });
                  }
                  return kernels::attention_backward(kept[0], kept[1], kept[2], *saved_o, *lse,
                                                     g[0], causal, scale, extras);
                });
}

// The attention output in the layout the output projection reads: one buffer
// [B, Tq, Hq * D], saved by this node and by the projection that consumes it.
// With attention() + transpose the [B, Hq, Tq, D] output stayed alive as
// well, for the backward's rowsum(dO * O) (75 MB over GPT-2 small's 12 layers
// at 2048 tokens); here backward transposes it back into a temporary.
Tensor attention_merged_heads(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                              float scale_in, const AttentionExtras& extras) {
  const float scale = attention_scale(q, scale_in);
  auto lse = std::make_shared<Tensor>();
  const TensorList inputs = attention_inputs(q, k, v, extras);
  const TensorList kept = attention_operands(inputs);
  // [B, Hq, Tq, D]
  const Tensor o = kernels::attention(kept[0], kept[1], kept[2], causal, scale, *lse, extras);
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), D = q.dim(3);
  static constexpr std::array<int, 4> kSwap{0, 2, 1, 3};  // [B, H, T, D] <-> [B, T, H, D]
  Tensor y = kernels::permute(o, kSwap).view({B, T, H * D});
  return detail::record_with_output(
      "attention", inputs, std::move(y),
      [kept, extras, causal, scale, lse, B, H, T, D](const Node& self, const Tensor& y,
                                                     const TensorList& g) {
        if (building_higher_order()) {
          check_not_higher_order(kept);
          return reference_vjp(self, kept, g[0], [&](const TensorList& in) {
            const Tensor r =
                attention_reference(in[0], in[1], in[2], causal, scale, with_bias(extras, in));
            return reshape(transpose(r, 1, 2), {B, T, H * D});
          });
        }
        const Tensor o = kernels::permute(y.view({B, T, H, D}), kSwap);
        const Tensor dout = kernels::permute(g[0].view({B, T, H, D}), kSwap);
        return kernels::attention_backward(kept[0], kept[1], kept[2], o, *lse, dout, causal, scale,
                                           extras);
      });
}

// ---- convolution ----------------------------------------------------------------------------
// conv2d is bilinear in (x, w); its two backward products are bilinear too,
// and each one's gradients are the other two products:
//   dx = conv_input_grad(dy, w)      dw = conv_weight_grad(x, dy)
namespace {
struct ConvArgs {
  int64_t stride, pad;
};
Tensor conv_input_grad(const Tensor& dy, const Tensor& w, const Shape& x_shape, ConvArgs a);
Tensor conv_weight_grad(const Tensor& x, const Tensor& dy, const Shape& w_shape, ConvArgs a);

Tensor conv_input_grad(const Tensor& dy, const Tensor& w, const Shape& x_shape, ConvArgs a) {
  // The kernel computes dx and dw together; with x = 0 only dx is wanted.
  Tensor dx = kernels::conv2d_backward(dy, Tensor::zeros(x_shape, DType::f32, dy.device()), w,
                                       false, a.stride, a.pad)[0];
  return record(
      "conv2d_input_grad", {dy, w}, dx, [dy, w, a](const Node& self, const TensorList& g) {
        return TensorList{self.needs_grad(0) ? conv2d(g[0], w, {}, a.stride, a.pad) : Tensor(),
                          self.needs_grad(1) ? conv_weight_grad(g[0], dy, w.shape(), a) : Tensor()};
      });
}

Tensor conv_weight_grad(const Tensor& x, const Tensor& dy, const Shape& w_shape, ConvArgs a) {
  Tensor dw = kernels::conv2d_backward(dy, x, Tensor::zeros(w_shape, DType::f32, dy.device()),
                                       false, a.stride, a.pad)[1];
  return record(
      "conv2d_weight_grad", {x, dy}, dw, [x, dy, a](const Node& self, const TensorList& g) {
        return TensorList{self.needs_grad(0) ? conv_input_grad(dy, g[0], x.shape(), a) : Tensor(),
                          self.needs_grad(1) ? conv2d(x, g[0], {}, a.stride, a.pad) : Tensor()};
      });
}
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t pad) {
  Tensor y = kernels::conv2d(x, w, bias, stride, pad);
  return record(
      "conv2d", {x, w, bias}, y,
      [x, w, has_bias = bias.defined(), stride, pad](const Node& self, const TensorList& g) {
        if (!building_higher_order())
          return kernels::conv2d_backward(g[0], x, w, has_bias, stride, pad);
        const ConvArgs a{stride, pad};
        return TensorList{self.needs_grad(0) ? conv_input_grad(g[0], w, x.shape(), a) : Tensor(),
                          self.needs_grad(1) ? conv_weight_grad(x, g[0], w.shape(), a) : Tensor(),
                          has_bias ? sum(g[0], {0, 2, 3}) : Tensor()};
      });
}

// ---- pooling ----------------------------------------------------------------------------------
namespace {
// Routes dy to the argmax positions (the max-pool gradient); its adjoint reads
// dx back at those positions.
Tensor max_pool_scatter(const Tensor& dy, const Tensor& argmax, const Shape& x_shape, int64_t k,
                        int64_t stride) {
  return record("max_pool2d_scatter", {dy},
                kernels::max_pool2d_backward(dy, argmax, x_shape, k, stride),
                [argmax](const Node&, const TensorList& g) {
                  return TensorList{kernels::max_pool2d_gather(g[0], argmax)};
                });
}
Tensor avg_pool_spread(const Tensor& dy, const Shape& x_shape, int64_t k, int64_t stride) {
  return record("avg_pool2d_spread", {dy}, kernels::avg_pool2d_backward(dy, x_shape, k, stride),
                [k, stride](const Node&, const TensorList& g) {
                  return TensorList{avg_pool2d(g[0], k, stride)};
                });
}
}  // namespace

Tensor max_pool2d(const Tensor& x, int64_t k, int64_t stride) {
  if (stride < 0) stride = k;
  auto argmax = std::make_shared<Tensor>();
  Tensor y = kernels::max_pool2d(x, k, stride, *argmax);
  return record("max_pool2d", {x}, y,
                [argmax, xs = x.shape(), k, stride](const Node&, const TensorList& g) {
                  return TensorList{max_pool_scatter(g[0], *argmax, xs, k, stride)};
                });
}

Tensor avg_pool2d(const Tensor& x, int64_t k, int64_t stride) {
  if (stride < 0) stride = k;
  return record("avg_pool2d", {x}, kernels::avg_pool2d(x, k, stride),
                [xs = x.shape(), k, stride](const Node&, const TensorList& g) {
                  return TensorList{avg_pool_spread(g[0], xs, k, stride)};
                });
}

// ---- nearest upsampling: linear; its adjoint sums each block, whose adjoint is it again ----
namespace {
Tensor upsample_block_sum(const Tensor& dy, int64_t f) {
  return record(
      "upsample_nearest2d_sum", {dy}, kernels::upsample_nearest2d_backward(dy, f),
      [f](const Node&, const TensorList& g) { return TensorList{upsample_nearest2d(g[0], f)}; });
}
}  // namespace

Tensor upsample_nearest2d(const Tensor& x, int64_t factor) {
  return record("upsample_nearest2d", {x}, kernels::upsample_nearest2d(x, factor),
                [factor](const Node&, const TensorList& g) {
                  return TensorList{upsample_block_sum(g[0], factor)};
                });
}

}  // namespace redco
