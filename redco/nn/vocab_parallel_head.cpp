// The LM head and its loss over this rank's rows of the vocabulary, a chunk
// of token rows at a time (see vocab_parallel_linear_cross_entropy in
// tensor_parallel.hpp).
//
// Composed of differentiable ops (vocab_parallel_cross_entropy), the loss of
// vocabulary-split logits keeps three [tokens, vocab / mp] buffers from
// forward to backward (the shifted logits, their exp, the label one-hot):
// GPT-2 small at 2048 tokens on 2 shards, 590 MB a rank, where one device's
// fused head keeps none. Here, as there, each chunk's gradient is taken in
// forward while its logits are alive:
//   logits_c = x_c w^T                                   [n, V/mp]
//   m        = max over every shard's columns            [n]  (all-gather)
//   s        = sum over every shard of exp(logits_c - m) [n]  (all-reduce)
//   t        = the label's logit - m, on its shard       [n]  (all-reduce)
//   loss_r   = log s - t
//   dlogits  = (exp(logits_c - m) / s - onehot) / kept   (this shard's columns)
//   dx_c     = dlogits w     (this shard's term: the head's input enters the
//                             parallel region, whose backward sums the terms)
//   dw      += dlogits^T x_c (this shard's rows)
// The loss is a scalar, so backward only scales dx and dw.
#include <algorithm>
#include <array>

#include "redco/autodiff/recording.hpp"
#include "redco/nn/parallel_ops.hpp"
#include "redco/nn/tensor_parallel.hpp"
#include "redco/ops/backend.hpp"

namespace redco::nn {
namespace {

constexpr int64_t kChunkBytes = int64_t(64) << 20;  // logits per chunk, as one device's head

struct HeadGrads {
  Tensor dx;  // [rows, d]: this shard's term of d loss / d x, for an incoming gradient of 1
  Tensor dw;  // [V/mp, d]
};

// The chunk's per-row maximum over every shard's columns: [n].
Tensor row_max(const Tensor& logits, comm::Comm& mp) {
  const std::array<int, 1> cols{1};
  const int64_t n = logits.dim(0);
  const Tensor mine = kernels::reduce(ReduceOp::max, logits, cols).view({n});
  Tensor all = Tensor::empty(Shape{mp.size() * n}, DType::f32, mine.device());
  sched::sync_wait(mp.all_gather(mine, all));
  const std::array<int, 1> shards{0};
  return kernels::reduce(ReduceOp::max, all.view({mp.size(), n}), shards).view({n});
}

Tensor summed(Tensor t, comm::Comm& mp) {
  sched::sync_wait(mp.all_reduce(t, comm::ReduceOp::sum));
  return t;
}

// The sum of the rows' losses (a host double); with `grads`, the gradients
// of that sum times `scale` into them.
double head_chunks(const Tensor& x, const Tensor& w, const std::vector<int64_t>& labels,
                   int64_t ignore_index, comm::Comm& mp, float scale, HeadGrads* grads) {
  const int64_t rows = x.dim(0), part = w.dim(0), begin = int64_t(mp.rank()) * part;
  const Device device = x.device();
  const int64_t step = std::clamp<int64_t>(kChunkBytes / (part * 4) / 16 * 16, 16, rows);
  const std::array<int, 1> cols{1};
  double total = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t n = std::min(step, rows - r0);
    const Tensor xc = x.slice0(r0, r0 + n);                                // [n, d]
    Tensor z = kernels::matmul(xc, w, false, true);                        // [n, V/mp]
    const Tensor m = row_max(z, mp);                                       // [n]
    z = kernels::binary(BinaryOp::sub, z, m.view({n, 1}));                 // in logits' place
    Tensor e = kernels::unary(UnaryOp::exp, z);                            // [n, V/mp]
    const Tensor s = summed(kernels::reduce(ReduceOp::sum, e, cols), mp);  // [n]
    // The label's column where this shard holds it, and each row's weight.
    std::vector<float> onehot(size_t(n * part), 0.f), weight(size_t(n), 0.f);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t l = labels[size_t(r0 + i)];
      if (l == ignore_index) continue;
      REDCO_CHECK(l >= 0 && l < part * mp.size(),
                  "cross_entropy: label {} is out of range for {} classes (row {})", l,
                  part * mp.size(), r0 + i);
      weight[size_t(i)] = scale;
      if (l >= begin && l < begin + part) onehot[size_t(i * part + l - begin)] = 1.f;
    }
    const Tensor pick =
        Tensor::from<float>(std::span<const float>(onehot), Shape{n, part}).to(device);
    const Tensor t =
        summed(kernels::reduce(ReduceOp::sum, kernels::binary(BinaryOp::mul, z, pick), cols), mp);
    z = Tensor();
    const std::vector<float> sh = s.to(Device::cpu()).values<float>();
    const std::vector<float> th = t.to(Device::cpu()).values<float>();
    for (int64_t i = 0; i < n; ++i)
      if (weight[size_t(i)] != 0.f)
        total += std::log(double(sh[size_t(i)])) - double(th[size_t(i)]);
    if (!grads) continue;
    const Tensor wr = Tensor::from<float>(std::span<const float>(weight), Shape{n, 1}).to(device);
    e = kernels::binary(BinaryOp::div, e, s.view({n, 1}));  // softmax over every shard
    e = kernels::binary(BinaryOp::mul, kernels::binary(BinaryOp::sub, e, pick), wr);
    if (grads->dx.defined()) {
      Tensor dxc = grads->dx.slice0(r0, r0 + n);
      kernels::matmul_into(e, w, false, false, dxc, false);
    }
    if (grads->dw.defined()) kernels::matmul_into(e, xc, true, false, grads->dw, r0 > 0);
  }
  return total;
}

Tensor scaled(const Tensor& t, const Tensor& g) {
  if (g.device().is_cpu() && g.item() == 1.f) return t;
  return kernels::binary(BinaryOp::mul, t, g);
}

}  // namespace

Tensor vocab_parallel_linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& labels,
                                           comm::Comm& mp, int64_t ignore_index) {
  REDCO_CHECK(w.rank() == 2 && x.rank() >= 1 && x.shape().last() == w.dim(1),
              "cross_entropy: the LM head's input {} does not match its rows of the table {}",
              x.shape(), w.shape());
  REDCO_CHECK(labels.dtype() == DType::i64 && labels.shape() == x.shape().drop(-1),
              "cross_entropy: the LM head's input {} needs i64 labels of shape {}, got {}{}",
              x.shape(), x.shape().drop(-1), dtype_name(labels.dtype()), labels.shape());
  const int64_t d = w.dim(1);
  const std::vector<int64_t> lab = labels.to(Device::cpu()).values<int64_t>();
  int64_t kept = 0;
  for (int64_t l : lab) kept += l != ignore_index;
  const float scale = 1.f / float(std::max<int64_t>(kept, 1));  // all ignored: loss 0
  const Tensor x2 = x.detach().view({-1, d});
  // Under Precision::bf16 the table is rounded once for every chunk's products.
  const Precision precision = matmul_precision();
  const Tensor wc = precision == Precision::bf16 ? w.detach().to(DType::bf16) : w.detach();
  const bool recorded = needs_graph({x, w});
  auto saved = std::make_shared<HeadGrads>();
  if (recorded && x.requires_grad()) saved->dx = Tensor::empty(x2.shape(), DType::f32, x.device());
  if (recorded && w.requires_grad()) saved->dw = Tensor::empty(w.shape(), DType::f32, w.device());
  const double total =
      head_chunks(x2, wc, lab, ignore_index, mp, scale, recorded ? saved.get() : nullptr);
  Tensor loss = Tensor::full(Shape{}, float(total * scale), DType::f32, x.device());
  if (!recorded) return loss;
  return record("vocab_parallel_linear_cross_entropy", {x, w}, loss,
                [saved, precision](const Node& self, const TensorList& g) {
                  REDCO_CHECK(!redco::detail::building_higher_order(),
                              "cross_entropy: gradients of gradients (create_graph) through a "
                              "vocabulary-split LM head are not supported; run the model with "
                              "n_model_shards = 1 or without create_graph");
                  PrecisionGuard same(precision);
                  TensorList grads(2);
                  if (self.needs_grad(0))
                    grads[0] = scaled(saved->dx, g[0]).view(self.input_meta()[0].shape);
                  if (self.needs_grad(1)) grads[1] = scaled(saved->dw, g[0]);
                  if (redco::detail::last_run_of_rule()) *saved = HeadGrads{};
                  return grads;
                });
}

}  // namespace redco::nn
