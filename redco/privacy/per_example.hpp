#pragma once
// Per-example gradient norms of linear, embedding and conv2d layers from what
// backpropagation already has, each layer's input and output gradient,
// without forming the B per-example weight gradients: the "ghost clipping"
// identity (Goodfellow 2015; Li et al. 2022, "Large Language Models Can Be
// Strong Differentially Private Learners"). For a linear layer used at T
// positions of example b, with inputs a_t and output gradients g_t,
//
//   G_b = sum_t g_t a_t^T                     [out, in]
//   ||G_b||^2 = sum_{t,t'} (a_t . a_t') (g_t . g_t')   (a [T,T] Gram product)
//
// which costs O(T^2 (in + out)) instead of O(T in out) memory per example.
// When 2 T^2 > in * out the Gram matrices are the larger object, and G_b is
// formed instead, a few examples at a time ("mixed" ghost clipping, Bu et al.
// 2022): the result is the same.
//
// DP-SGD then scales each example's gradient by clip_factors(total squared
// norm over all layers, C) and sums: for a linear layer that sum is one GEMM
// with the output gradients scaled per example (clipped_*_grad below).
//
// All functions run without recording autodiff history; shapes are checked
// and a mismatch is one redco::Error naming the function and both shapes.
#include "redco/autodiff/functional.hpp"

namespace redco::privacy {

// input [B, T, in] or [B, in]; grad_output [B, T, out] or [B, out] -> [B]:
// ||d loss_b / d W||_F^2 for y = x W^T (+ bias).
Tensor linear_weight_grad_sq_norms(const Tensor& input, const Tensor& grad_output);
// grad_output [B, T, out] or [B, out] -> [B]: ||sum_t g_t||^2, the bias's.
Tensor linear_bias_grad_sq_norms(const Tensor& grad_output);

// ids [B, T] i64, grad_output [B, T, D] -> [B]: the table gradient's squared
// norm, sum over positions t, t' holding the same id of g_t . g_t'.
Tensor embedding_grad_sq_norms(const Tensor& ids, const Tensor& grad_output);

// x [N, C, H, W] (CPU), grad_output [N, O, OH, OW], kernel kh x kw -> [N]:
// the weight gradient's squared norm, by the linear identity with the OH*OW
// output positions as T and the im2col patches [C*kh*kw] as inputs. The
// bias's: ||sum over positions of g||^2.
Tensor conv2d_weight_grad_sq_norms(const Tensor& x, const Tensor& grad_output, int64_t kh,
                                   int64_t kw, int64_t stride = 1, int64_t pad = 0);
Tensor conv2d_bias_grad_sq_norms(const Tensor& grad_output);

// [B] squared norms -> [B] factors min(1, max_norm / (norm + 1e-6)).
Tensor clip_factors(const Tensor& sq_norms, float max_norm);

// The clipped sums sum_b factors[b] * G_b, from the same inputs and output
// gradients, so one backward pass (to the layer outputs) serves both the norms
// and the update. Linear weight: [out, in], one GEMM; bias: [out].
Tensor clipped_linear_weight_grad(const Tensor& input, const Tensor& grad_output,
                                  const Tensor& factors);
Tensor clipped_linear_bias_grad(const Tensor& grad_output, const Tensor& factors);
// conv2d weight [O, C, kh, kw] (CPU, as conv2d_weight_grad_sq_norms) and bias [O].
Tensor clipped_conv2d_weight_grad(const Tensor& x, const Tensor& grad_output, const Tensor& factors,
                                  int64_t kh, int64_t kw, int64_t stride = 1, int64_t pad = 0);
Tensor clipped_conv2d_bias_grad(const Tensor& grad_output, const Tensor& factors);
// (An embedding's clipped sum is its ordinary backward of the output gradient
// scaled per example: grad_output * factors[b].)

}  // namespace redco::privacy
