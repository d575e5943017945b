#pragma once
// Differentiable operations: free functions on Tensors, each with its
// gradient rule next to its definition (see ops_*.cpp). Gradient rules are
// themselves written with these functions, so gradients of gradients work.
// Fused ops (norms, softmax, attention, ...) use fused backward kernels, and
// when a higher-order gradient is requested they differentiate an equivalent
// composition of primitive ops instead.
#include <vector>

#include "redco/autodiff/node.hpp"
#include "redco/ops/backend.hpp"

namespace redco {

// ---- elementwise, with numpy broadcasting ----------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // gradient goes to the larger (a on ties)
Tensor add(const Tensor& a, float s);
Tensor mul(const Tensor& a, float s);
Tensor pow(const Tensor& a, float p);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);
// Not differentiable: 1.f where a > b (or a == b) else 0.f.
Tensor greater(const Tensor& a, const Tensor& b);
Tensor equal(const Tensor& a, const Tensor& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& a, float s) { return add(a, s); }
inline Tensor operator+(float s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(const Tensor& a, float s) { return add(a, -s); }
inline Tensor operator-(float s, const Tensor& a) { return add(neg(a), s); }
inline Tensor operator*(const Tensor& a, float s) { return mul(a, s); }
inline Tensor operator*(float s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, float s) { return mul(a, 1.f / s); }
inline Tensor operator/(float s, const Tensor& a) { return mul(pow(a, -1.f), s); }

// ---- reductions -------------------------------------------------------------
Tensor sum(const Tensor& x);  // all elements -> scalar
Tensor sum(const Tensor& x, std::vector<int> axes, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, std::vector<int> axes, bool keepdim = false);
Tensor max(const Tensor& x, int axis, bool keepdim = false);  // gradient to the first max
Tensor argmax(const Tensor& x, int axis);                     // i64, not differentiable
Tensor broadcast_to(const Tensor& x, const Shape& shape);
Tensor sum_to(const Tensor& x, const Shape& shape);  // adjoint of broadcast_to

// ---- shapes -----------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);  // one dim may be -1
Tensor flatten(const Tensor& x, int start_axis = 1);  // [a, b, c, d] -> [a, b*c*d]
Tensor transpose(const Tensor& x, int axis0, int axis1);
Tensor permute(const Tensor& x, std::vector<int> perm);
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t end);
Tensor concat(const TensorList& xs, int axis);
TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int axis);

// ---- linear algebra ---------------------------------------------------------
// op(a)[..., M, K] @ op(b)[..., K, N]; leading (batch) dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x [..., in] @ w[out, in]^T + bias[out] (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = {});
// linear(x, concat(ws, 0), concat(bs, 0)) as one GEMM, without keeping the
// stacked weights for backward. bs: one bias per weight, or none.
Tensor linear_stacked(const Tensor& x, const TensorList& ws, const TensorList& bs = {});
// Whether linear_stacked stacks this weight as stored (one plain copy): false
// for a weight packed for decoding or quantized by rows, which it converts.
bool stacks_as_stored(const Tensor& w);

// ---- neural-network ops (fused) -----------------------------------------------
Tensor softmax(const Tensor& x);      // over the last axis
Tensor log_softmax(const Tensor& x);  // over the last axis
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta = {}, float eps = 1e-5f);
Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps = 1e-6f);
// x [N, C, ...] normalised per sample over each of `groups` groups of C /
// groups channels, then gamma[c] * . + beta[c]; gamma, beta [C] (beta may be
// undefined). torch.nn.functional.group_norm.
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& gamma, const Tensor& beta = {},
                  float eps = 1e-5f);
Tensor gelu(const Tensor& x, bool tanh_approx = true);
// linear(gelu(y + b), w) without keeping gelu's input or output for backward
// (recomputed from y): the middle of a GELU MLP. b may be undefined.
Tensor bias_gelu_linear(const Tensor& y, const Tensor& b, const Tensor& w, bool tanh_approx = true);
Tensor silu(const Tensor& x);
// Mean over rows whose label != ignore_index of -log softmax(logits)[label].
// logits [..., V] f32, labels [...] i64. Logits split by their last dim across
// a model-parallel group (a Placement, see nn::whole) give the same loss,
// computed without gathering them.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);
// cross_entropy(matmul(x, w, false, true), labels) for an LM head w [V, d] on
// x [..., d], without forming the [..., V] logits whole: they are computed
// and differentiated a chunk of rows at a time (ops_lm_head.cpp).
// chunk_rows 0: chunks of at most 64 MiB of logits.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& labels,
                            int64_t ignore_index = -100, int64_t chunk_rows = 0);
Tensor embedding(const Tensor& table, const Tensor& ids);  // table [V, D], ids i64 [...]
// Zeroes each element with probability p and scales the rest by 1/(1-p); the
// mask depends only on (seed, stream, element index).
Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream);
// x [B, H, T, D]; positions pos_offset + t.
Tensor rotary(const Tensor& x, int64_t pos_offset = 0, float base = 10000.f);
// Scaled dot-product attention, fused (O(T) memory); q [B,Hq,Tq,D], k/v [B,Hkv,Tk,D].
// scale < 0 means 1/sqrt(D). `extras`: key ranges of padded rows and an
// additive score bias [Hq, Tq, Tk] (differentiable), see AttentionExtras.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                 float scale = -1.f, const AttentionExtras& extras = {});
// attention(q, k, v) with its heads merged: [B, Tq, Hq * D], the input of an
// output projection. Keeps one output buffer for backward instead of two.
Tensor attention_merged_heads(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                              float scale = -1.f, const AttentionExtras& extras = {});
// The same attention as a composition of primitive ops (O(T^2) memory): the
// reference for tests and the path taken for higher-order gradients.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                           float scale = -1.f, const AttentionExtras& extras = {});
// x [N, C, H, W], w [O, C, KH, KW], bias [O] (may be undefined).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias = {}, int64_t stride = 1,
              int64_t pad = 0);
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1);  // stride -1: = kernel
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1);
// x [N, C, H, W] -> [N, C, H*factor, W*factor], each pixel repeated (nearest).
Tensor upsample_nearest2d(const Tensor& x, int64_t factor = 2);

}  // namespace redco
