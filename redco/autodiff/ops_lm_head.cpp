// The LM head and its loss as one op: cross_entropy(x w^T, labels) without
// ever forming the whole [rows, vocab] logits. They are the largest buffer of
// a language-model step (GPT-2's vocabulary at 2048 tokens: 412 MB); here
// they exist one chunk of rows at a time (at most kChunkBytes).
//
// When the op is recorded, each chunk's gradient is taken in forward, while
// its logits are alive:
//   logits_c  = x_c w^T                              [n, V]
//   dlogits_c = (softmax(logits_c) - onehot) / kept   written over logits_c
//   dx_c      = dlogits_c w                          [n, d]  (rows of dx)
//   dw       += dlogits_c^T x_c                      [V, d]
// The loss is a scalar, so backward only scales dx and dw by the incoming
// gradient. These are the three GEMMs the unfused head runs (no logits GEMM
// is repeated); the price is dw held from forward to backward, the same
// buffer backward would allocate first thing. Under create_graph the
// gradient goes through the composition instead.
#include <algorithm>
#include <array>

#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {
using detail::building_higher_order;
using detail::last_run_of_rule;
using detail::reference_vjp;

namespace {
// Logits per chunk: large enough that the GEMMs run at full rate (hundreds of
// rows), small enough to be a fraction of the unfused head's buffer.
constexpr int64_t kChunkBytes = int64_t(64) << 20;
// On a GPU, chunks of a few hundred rows leave the head's GEMMs short of the
// tensor cores' rate (dw += dlogits^T x has K = the chunk's rows, and each
// chunk re-reads and re-writes all of dw: 154 MB for GPT-2's): there, a few
// large chunks.
constexpr int64_t kGpuChunkBytes = int64_t(512) << 20;

// cuBLAS runs the head's GEMMs several times slower when the vocabulary is
// not a multiple of 8 (an H200, bf16, [2400 rows, 50257, 768]: 93 TFLOP/s;
// the same with 50304 columns: 610). Off the CPU (a GPU, and the test device
// that stands in for one in CI) the table is therefore padded
// with zero rows to a multiple of kVocabPad: each chunk's logits come out
// [n, Vp], the loss reads their first V columns (a copy), and the gradient
// goes back padded with zeros, so dx and dw are the unpadded ones exactly.
constexpr int64_t kVocabPad = 64;

int64_t padded_vocab(int64_t V, Device device) {
  if (device.is_cpu() || V % 8 == 0) return V;
  return (V + kVocabPad - 1) / kVocabPad * kVocabPad;
}

// Rows per chunk: equal chunks of at most the device's chunk bytes, rounded
// up to 16 rows.
int64_t auto_chunk_rows(int64_t rows, int64_t vocab, Device device) {
  const int64_t limit = device.kind == DeviceKind::cuda ? kGpuChunkBytes : kChunkBytes;
  const int64_t bytes = rows * vocab * int64_t(sizeof(float));
  const int64_t chunks = std::max<int64_t>(1, (bytes + limit - 1) / limit);
  const int64_t n = (rows + chunks - 1) / chunks;
  return std::clamp<int64_t>((n + 15) / 16 * 16, 1, std::max<int64_t>(rows, 1));
}

struct HeadGrads {
  Tensor dx;  // [rows, d]: d loss / d x, for an incoming gradient of 1
  Tensor dw;  // [V, d]
};

// The sum of the rows' losses ([1]); with `grads`, also the gradients of
// (that sum * scale) into it, where they are wanted.
Tensor head_chunks(const Tensor& x, const Tensor& w_in, const Tensor& labels, int64_t ignore_index,
                   int64_t step, float scale, HeadGrads* grads) {
  const int64_t rows = x.dim(0), V = w_in.dim(0), Vp = padded_vocab(V, x.device());
  // Under bf16 precision every chunk's two GEMMs with the table would round
  // it again (154 MB for GPT-2's): round it once, stored as bf16 [V, d].
  Tensor w = matmul_precision() == Precision::bf16 ? w_in.to(DType::bf16) : w_in;
  Tensor dw = grads ? grads->dw : Tensor();  // [Vp, d] while padded
  if (Vp != V) {
    Tensor wp = Tensor::zeros({Vp, w.dim(1)}, w.dtype(), w.device());
    kernels::slice_assign(wp, w, 0, 0);
    w = wp;
    if (dw.defined()) dw = Tensor::empty({Vp, dw.dim(1)}, DType::f32, dw.device());
  }
  Tensor total;  // [1]
  const std::array<int, 1> axis0{0};
  for (int64_t begin = 0; begin < rows; begin += step) {
    const int64_t n = std::min(step, rows - begin);
    const Tensor xc = x.slice0(begin, begin + n);                            // [n, d]
    const Tensor lc = labels.slice0(begin, begin + n);                       // [n]
    Tensor logits_p = kernels::matmul(xc, w, false, true);                   // [n, Vp]
    Tensor logits = Vp == V ? logits_p : kernels::slice(logits_p, 1, 0, V);  // [n, V]
    Tensor lse;                                                              // [n]
    const Tensor losses = kernels::cross_entropy(logits, lc, ignore_index, lse);
    const Tensor part = kernels::reduce(ReduceOp::sum, losses, axis0);
    if (total.defined())
      kernels::add_inplace(total, part);
    else
      total = part;
    if (!grads) continue;
    Tensor dloss = Tensor::empty(Shape{n}, DType::f32, x.device());  // [n]
    dloss.fill(scale);
    Tensor dlogits =  // [n, V], in logits' buffer
        kernels::cross_entropy_backward(logits, lc, lse, dloss, ignore_index, true);
    logits = Tensor();
    if (Vp != V) {  // [n, Vp] in the padded logits' buffer, whose padding is 0 (zero rows of w)
      kernels::slice_assign(logits_p, dlogits, 1, 0);
      dlogits = logits_p;
    }
    logits_p = Tensor();
    if (grads->dx.defined()) {
      Tensor dxc = grads->dx.slice0(begin, begin + n);
      kernels::matmul_into(dlogits, w, false, false, dxc, false);
    }
    if (dw.defined()) kernels::matmul_into(dlogits, xc, true, false, dw, begin > 0);
  }
  if (dw.defined() && Vp != V) grads->dw = kernels::slice(dw, 0, 0, V);
  return total;
}

// g * t, reusing t when g is exactly 1 (the loss itself is what is
// differentiated: the common case, and no pass over dw).
Tensor scaled(const Tensor& t, const Tensor& g) {
  if (g.device().is_cpu() && g.item() == 1.f) return t;
  return kernels::binary(BinaryOp::mul, t, g);
}
}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& labels,
                            int64_t ignore_index, int64_t chunk_rows) {
  REDCO_CHECK(w.rank() == 2 && x.rank() >= 1 && x.shape().last() == w.dim(1),
              "linear_cross_entropy: input {} does not match the head's weight {} (stored "
              "[vocab, dim])",
              x.shape(), w.shape());
  REDCO_CHECK(labels.dtype() == DType::i64 && labels.shape() == x.shape().drop(-1),
              "linear_cross_entropy: input {} needs i64 labels of shape {}, got {}{}", x.shape(),
              x.shape().drop(-1), dtype_name(labels.dtype()), labels.shape());
  const int64_t d = w.dim(1), kept = detail::counted_labels(labels, ignore_index);
  const float scale = 1.f / float(std::max<int64_t>(kept, 1));  // all ignored: loss 0, not 0/0
  const Tensor x2 = x.view({-1, d}), labels1 = labels.view({-1});
  const Precision precision = matmul_precision();
  const bool recorded = needs_graph({x, w});
  auto saved = std::make_shared<HeadGrads>();
  if (recorded && x.requires_grad()) saved->dx = Tensor::empty(x2.shape(), DType::f32, x.device());
  if (recorded && w.requires_grad()) saved->dw = Tensor::empty(w.shape(), DType::f32, w.device());
  const int64_t step =
      chunk_rows > 0 ? chunk_rows : auto_chunk_rows(x2.dim(0), w.dim(0), x.device());
  const Tensor total =
      head_chunks(x2, w, labels1, ignore_index, step, scale, recorded ? saved.get() : nullptr);
  const Tensor loss = kernels::binary_scalar(BinaryOp::mul, total.view(Shape{}), scale);
  return record("linear_cross_entropy", {x, w}, loss,
                [saved_x = detail::SavedInput(x), saved_w = detail::SavedInput(w), labels,
                 ignore_index, precision, saved](const Node& self, const TensorList& g) {
                  if (building_higher_order())
                    return reference_vjp(self, {saved_x.get(), saved_w.get()}, g[0],
                                         [&](const TensorList& in) {
                                           PrecisionGuard same(precision);
                                           return cross_entropy(matmul(in[0], in[1], false, true),
                                                                labels, ignore_index);
                                         });
                  TensorList grads(2);
                  if (self.needs_grad(0))
                    grads[0] = scaled(saved->dx, g[0]).view(self.input_meta()[0].shape);
                  if (self.needs_grad(1)) grads[1] = scaled(saved->dw, g[0]);
                  if (last_run_of_rule())
                    *saved = HeadGrads{};  // the engine now holds the only handles
                  return grads;
                });
}

}  // namespace redco
