// Fused neural-network ops: softmax family, norms, activations, cross entropy.
// First-order gradients use the fused backward kernels. When the backward pass
// is itself being recorded (create_graph), the gradient is taken through an
// equivalent composition of primitive ops, which can be differentiated again.
#include <cmath>
#include <numbers>

#include "redco/autodiff/autograd_meta.hpp"
#include "redco/autodiff/loss_on_parts.hpp"
#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {
namespace detail {

int64_t counted_labels(const Tensor& labels, int64_t ignore_index) {
  int64_t counted = 0;
  const Tensor host = labels.to(Device::cpu());  // the loss's divisor: one explicit copy
  const int64_t* l = host.data<int64_t>();
  for (int64_t r = 0; r < labels.numel(); ++r) counted += l[r] != ignore_index;
  return counted;
}

TensorList reference_vjp(const Node& self, const TensorList& inputs, const Tensor& grad_out,
                         const std::function<Tensor(const TensorList&)>& reference) {
  TensorList wrt, result(inputs.size());
  std::vector<size_t> where;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!self.needs_grad(int(i)) || !inputs[i].requires_grad()) continue;
    wrt.push_back(inputs[i]);
    where.push_back(i);
  }
  if (wrt.empty()) return result;
  Tensor y = reference(inputs);
  TensorList g = grad({y}, wrt, {grad_out}, {.create_graph = true, .allow_unused = true});
  for (size_t j = 0; j < where.size(); ++j) result[where[j]] = g[j];
  return result;
}

}  // namespace detail

using detail::building_higher_order;
using detail::last_run_of_rule;
using detail::owns_buffer;
using detail::record_with_output;
using detail::reference_vjp;

// ---- softmax family: the gradient needs only the output y --------------------------
Tensor softmax(const Tensor& x) {
  return record_with_output("softmax", {x}, kernels::softmax(x),
                            [](const Node&, const Tensor& y, const TensorList& g) {
                              if (!building_higher_order())
                                return TensorList{kernels::softmax_backward(y, g[0])};
                              // dx = y * (g - sum(g * y))
                              return TensorList{mul(y, g[0] - sum(mul(g[0], y), {-1}, true))};
                            });
}

Tensor log_softmax(const Tensor& x) {
  return record_with_output("log_softmax", {x}, kernels::log_softmax(x),
                            [](const Node&, const Tensor& y, const TensorList& g) {
                              if (!building_higher_order())
                                return TensorList{kernels::log_softmax_backward(y, g[0])};
                              // dx = g - exp(y) * sum(g)
                              return TensorList{g[0] - mul(exp(y), sum(g[0], {-1}, true))};
                            });
}

// ---- norms ------------------------------------------------------------------------------
namespace {
Tensor layer_norm_reference(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  Tensor centered = x - mean(x, {-1}, true);
  Tensor y = centered * rsqrt(mean(square(centered), {-1}, true) + eps) * gamma;
  return beta.defined() ? y + beta : y;
}
Tensor rms_norm_reference(const Tensor& x, const Tensor& gamma, float eps) {
  return x * rsqrt(mean(square(x), {-1}, true) + eps) * gamma;
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  auto saved = std::make_shared<LayerNormSaved>();
  Tensor y = kernels::layer_norm(x, gamma, beta, eps, *saved);
  y = record("layer_norm", {x, gamma, beta}, y,
             [x, gamma, beta, eps, saved](const Node& self, const TensorList& g) {
               if (building_higher_order())
                 return reference_vjp(self, {x, gamma, beta}, g[0], [eps](const TensorList& in) {
                   return layer_norm_reference(in[0], in[1], in[2], eps);
                 });
               return kernels::layer_norm_backward(g[0], x, gamma, beta.defined(), *saved);
             });
  // The node keeps x anyway: a consumer that saves y keeps this instead.
  if (y.requires_grad())
    autograd_meta(y)->recompute = [x, gamma, beta, eps] {
      LayerNormSaved again;
      return kernels::layer_norm(x, gamma, beta, eps, again);
    };
  return y;
}

Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps) {
  auto saved = std::make_shared<LayerNormSaved>();
  Tensor y = kernels::rms_norm(x, gamma, eps, *saved);
  y = record("rms_norm", {x, gamma}, y,
             [x, gamma, eps, saved](const Node& self, const TensorList& g) {
               if (building_higher_order())
                 return reference_vjp(self, {x, gamma}, g[0], [eps](const TensorList& in) {
                   return rms_norm_reference(in[0], in[1], eps);
                 });
               return kernels::rms_norm_backward(g[0], x, gamma, *saved);
             });
  if (y.requires_grad())  // as for layer_norm
    autograd_meta(y)->recompute = [x, gamma, eps] {
      LayerNormSaved again;
      return kernels::rms_norm(x, gamma, eps, again);
    };
  return y;
}

// ---- group norm: layer norm over channel groups of an image -------------------------------
namespace {
Tensor group_norm_reference(const Tensor& x, int64_t groups, const Tensor& gamma,
                            const Tensor& beta, float eps) {
  const Tensor slabs = reshape(x, {x.dim(0), groups, -1});  // [N, G, C/G * S]
  const Tensor centered = slabs - mean(slabs, {-1}, true);
  const Tensor normed =
      reshape(centered * rsqrt(mean(square(centered), {-1}, true) + eps), x.shape());
  Shape per_channel(std::vector<int64_t>(size_t(x.rank() - 1), 1));  // [C, 1, ...]
  per_channel = per_channel.with(0, x.dim(1));
  const Tensor y = normed * reshape(gamma, per_channel);
  return beta.defined() ? y + reshape(beta, per_channel) : y;
}
}  // namespace

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& gamma, const Tensor& beta,
                  float eps) {
  auto saved = std::make_shared<LayerNormSaved>();
  Tensor y = kernels::group_norm(x, gamma, beta, groups, eps, *saved);
  return record(
      "group_norm", {x, gamma, beta}, y,
      [x, groups, gamma, beta, eps, saved](const Node& self, const TensorList& g) {
        if (building_higher_order())
          return reference_vjp(self, {x, gamma, beta}, g[0], [groups, eps](const TensorList& in) {
            return group_norm_reference(in[0], groups, in[1], in[2], eps);
          });
        return kernels::group_norm_backward(g[0], x, gamma, groups, beta.defined(), *saved);
      });
}

// ---- activations ----------------------------------------------------------------------------
namespace {
Tensor gelu_reference(const Tensor& x, bool tanh_approx) {
  if (!tanh_approx) return 0.5f * x * (1.f + erf(x * float(1.0 / std::numbers::sqrt2)));
  const float c = float(std::sqrt(2.0 / std::numbers::pi));
  return 0.5f * x * (1.f + tanh(c * (x + 0.044715f * pow(x, 3.f))));
}
}  // namespace

Tensor gelu(const Tensor& x, bool tanh_approx) {
  return record("gelu", {x}, kernels::gelu(x, tanh_approx),
                [x, tanh_approx](const Node& self, const TensorList& g) {
                  if (building_higher_order())
                    return reference_vjp(self, {x}, g[0], [tanh_approx](const TensorList& in) {
                      return gelu_reference(in[0], tanh_approx);
                    });
                  return TensorList{kernels::gelu_backward(x, g[0], tanh_approx)};
                });
}

Tensor silu(const Tensor& x) {
  return record("silu", {x}, kernels::silu(x), [x](const Node& self, const TensorList& g) {
    if (building_higher_order())
      return reference_vjp(self, {x}, g[0],
                           [](const TensorList& in) { return in[0] * sigmoid(in[0]); });
    return TensorList{kernels::silu_backward(x, g[0])};
  });
}

// ---- the GELU MLP's middle: gelu(y + b) w^T ------------------------------------------------
// Memory, not FLOPs: separately, fc2's matmul keeps h = gelu(y + b) for its
// weight gradient and gelu keeps y + b, two [tokens, hidden] buffers per
// layer (50 MB per GPT-2-small layer at 2048 tokens). Fused, only y is kept
// and h is recomputed in backward (one add and one GELU pass, ~1% of the
// layer's time); the bias add also stops being a separate node. Under
// Precision::bf16, y is rounded to bf16 (as a bf16 GEMM's output would be)
// and kept so, half its bytes; forward and backward both read the rounded y.
Tensor bias_gelu_linear(const Tensor& y, const Tensor& b, const Tensor& w, bool tanh_approx) {
  REDCO_CHECK(w.rank() == 2 && y.rank() >= 1 && y.shape().last() == w.dim(1),
              "bias_gelu_linear: input {} does not match weight {} (stored [out, in])", y.shape(),
              w.shape());
  REDCO_CHECK(!b.defined() || b.shape() == Shape{w.dim(1)},
              "bias_gelu_linear: bias {} must be [{}] for weight {}", b.shape(), w.dim(1),
              w.shape());
  const Precision precision = matmul_precision();
  const int64_t hidden = w.dim(1), out = w.dim(0);
  // h = gelu(y + b) [rows, hidden], a temporary in both directions.
  auto activations = [=](const Tensor& u_kept) {
    const Tensor u = u_kept.dtype() == DType::f32 ? u_kept : u_kept.to(DType::f32);
    const Tensor pre = b.defined() ? kernels::binary(BinaryOp::add, u, b) : u;
    const Tensor pre2 = pre.view({-1, hidden});
    return std::pair{pre2, kernels::gelu(pre2, tanh_approx)};
  };
  const Tensor kept = precision == Precision::bf16 ? y.detach().to(DType::bf16) : y;
  Tensor z =
      kernels::matmul(activations(kept).second, w, false, true).view(y.shape().with(-1, out));
  return record(
      "bias_gelu_linear", {y, b, w}, std::move(z),
      [kept, b, saved_w = detail::SavedInput(w), tanh_approx, precision, activations, out](
          const Node& self, const TensorList& g) {
        PrecisionGuard same(precision);
        const Tensor w = saved_w.get();  // a ZeRO-3 weight is gathered again here
        if (building_higher_order()) {
          REDCO_CHECK(kept.dtype() != DType::bf16,
                      "bias_gelu_linear: gradients of gradients (create_graph) through an MLP "
                      "recorded under Precision::bf16 are not supported; record it under "
                      "Precision::f32");
          return reference_vjp(self, {kept, b, w}, g[0], [tanh_approx](const TensorList& in) {
            const Tensor pre = in[1].defined() ? add(in[0], in[1]) : in[0];
            return linear(gelu(pre, tanh_approx), in[2]);
          });
        }
        auto [pre, h] = activations(kept);       // recomputed: [rows, hidden]
        const Tensor dz = g[0].view({-1, out});  // [rows, out]
        Tensor dw = self.needs_grad(2) ? kernels::matmul(dz, h, true, false) : Tensor();
        h = Tensor();  // done with: one [rows, hidden] buffer less at the step's peak (here)
        Tensor du = kernels::gelu_backward(pre, kernels::matmul(dz, w, false, false), tanh_approx);
        Tensor db;
        if (b.defined() && self.needs_grad(1)) {
          const std::array<int, 1> rows{0};
          db = kernels::reduce(ReduceOp::sum, du, rows).view(b.shape());
        }
        return TensorList{du.view(kept.shape()), db, dw};
      });
}

// ---- cross entropy ----------------------------------------------------------------------------
namespace {
// onehot[r, labels[r]] = 1, rows with the ignored label all zero. [rows, V]
Tensor one_hot(const Tensor& labels, int64_t vocab, int64_t ignore_index) {
  Tensor out = Tensor::zeros({labels.numel(), vocab});
  const Tensor host = labels.to(Device::cpu());
  const int64_t* l = host.data<int64_t>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < labels.numel(); ++r)
    if (l[r] != ignore_index && l[r] >= 0 && l[r] < vocab) o[r * vocab + l[r]] = 1.f;
  return out.to(labels.device());  // built on the host, used where the labels are
}

// Per-row losses [rows]: logsumexp(logits[r]) - logits[r, label[r]]; 0 where ignored.
Tensor cross_entropy_rows(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  auto lse = std::make_shared<Tensor>();
  Tensor rows = kernels::cross_entropy(logits, labels, ignore_index, *lse);
  return record("cross_entropy", {logits}, rows,
                [logits, labels, ignore_index, lse](const Node& self, const TensorList& g) {
                  // The logits die with this rule: on its last run, and when
                  // nobody else holds them (a model output the caller dropped),
                  // their buffer takes the gradient (one [rows, vocab] buffer
                  // less at the peak: 412 MB for GPT-2's vocabulary at 2048
                  // tokens).
                  const bool reuse = last_run_of_rule() && owns_buffer(logits);
                  if (!building_higher_order())
                    return TensorList{kernels::cross_entropy_backward(logits, labels, *lse, g[0],
                                                                      ignore_index, reuse)};
                  const int64_t vocab = logits.shape().last();
                  Tensor target = one_hot(labels, vocab, ignore_index).view(logits.shape());
                  return reference_vjp(self, {logits}, g[0], [&](const TensorList& in) {
                    return neg(sum(mul(log_softmax(in[0]), target), {-1}));
                  });
                });
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  // Logits split across a model-parallel group (by vocabulary, or by class),
  // or not formed yet: their placement computes the loss from the parts
  // where it can (loss_on_parts.hpp), else they are made whole.
  if (const Placement* p = logits.placement()) {
    if (const auto* parts = dynamic_cast<const CrossEntropyOnParts*>(p))
      return parts->cross_entropy(logits, labels, ignore_index);
    return cross_entropy(p->whole(logits), labels, ignore_index);
  }
  REDCO_CHECK(labels.dtype() == DType::i64, "cross_entropy: labels must be i64, got {}{}",
              dtype_name(labels.dtype()), labels.shape());
  REDCO_CHECK(logits.rank() >= 1 && labels.shape() == logits.shape().drop(-1),
              "cross_entropy: logits {} need labels of shape {}, got {}", logits.shape(),
              logits.shape().drop(-1), labels.shape());
  const int64_t counted = detail::counted_labels(labels, ignore_index);
  // All rows ignored: the loss is 0 (and so is its gradient), not 0/0.
  return mul(sum(cross_entropy_rows(logits, labels, ignore_index)),
             1.f / float(std::max<int64_t>(counted, 1)));
}

// ---- dropout --------------------------------------------------------------------------------
Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream) {
  if (p == 0.f) return x;
  // The mask is a constant: the gradient is g * mask, and so on to any order.
  return mul(x, kernels::dropout_mask(x.shape(), p, seed, stream, x.device()));
}

}  // namespace redco
