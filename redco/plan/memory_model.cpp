// One training step's memory on one rank. Every term names the code whose
// buffer it counts; tests/test_memory_model holds the sums to the caching
// allocator's own figures.
#include "redco/plan/memory_model.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "redco/core/allocator.hpp"

namespace redco::plan {
namespace {

constexpr uint64_t kF32 = 4;

// A buffer as the caching allocator hands it out: rounded up to its size
// class (a quarter of a power of two below 1 MiB, 64 KiB above).
uint64_t allocated(uint64_t bytes) { return bytes ? CachingAllocator::round_size(bytes) : 0; }

uint64_t bytes_of(const Kept& k, const Workload& w, int mp) {
  const uint64_t elem = k.operand && w.precision == Precision::bf16 ? 2 : kF32;
  const int64_t width = k.split && k.width % mp == 0 ? k.width / mp : k.width;
  return uint64_t(width) * elem;
}
// The buffers of `ks` for n tokens each.
uint64_t kept_bytes(const std::vector<Kept>& ks, uint64_t n, const Workload& w, int mp) {
  uint64_t b = 0;
  for (const Kept& k : ks) b += allocated(bytes_of(k, w, mp) * n);
  return b;
}

struct Tokens {
  uint64_t target = 0, source = 0;  // tokens of one micro-batch on one replica
  int64_t target_len = 0, source_len = 0;
};
Tokens tokens_of(const Workload& w) {
  const int64_t src = w.source_len ? w.source_len : w.seq_len;
  return {uint64_t(w.micro_batch * w.seq_len), uint64_t(w.micro_batch * src), w.seq_len, src};
}

// The rows of the LM head's table on this rank: split by vocabulary when it divides.
uint64_t head_rows(const ModelShape& m, int mp) {
  return uint64_t(m.vocab % mp == 0 ? m.vocab / mp : m.vocab);
}

// A head cut by vocabulary over the model shards runs as one op with the
// loss as well (nn/vocab_parallel_head.cpp), a chunk of token rows at a
// time; each chunk holds its logits, their exp, the label one-hot and a
// product of two of them at once.
bool vocab_split(const ModelShape& m, int mp) {
  return mp > 1 && m.vocab % mp == 0 && !m.whole_logits && m.classes == 0;
}

// One block's kept bytes (its largest stack's), for one micro-batch.
// Under tensor parallelism each split sublayer's input enters the parallel
// region as a copy (nn/parallel_ops.hpp copy_to_parallel), which its first
// linear layer keeps instead of the norm output it would recompute: a whole
// [tokens, d] per split sublayer, and for cross-attention the encoder's
// output [source tokens, d] as well.
uint64_t entry_copies(const ModelShape& m, const Stack& s, uint64_t n, uint64_t source, int mp) {
  if (mp <= 1) return 0;
  const uint64_t row = uint64_t(m.dim) * kF32;
  const uint64_t sublayers = s.cross_width ? 3 : 2;
  return sublayers * allocated(n * row) + (s.cross_width ? allocated(source * row) : 0);
}

// One block's kept bytes for one micro-batch, in a stack.
uint64_t block_bytes(const ModelShape& m, const Stack& s, const Workload& w,
                     const Parallelism& par) {
  const Tokens t = tokens_of(w);
  const uint64_t n = s.over_source ? t.source : t.target;
  return kept_bytes(s.per_token, n, w, par.mp) +
         kept_bytes(s.per_source_token, t.source, w, par.mp) +
         entry_copies(m, s, n, t.source, par.mp);
}

uint64_t largest_block(const ModelShape& m, const Workload& w, const Parallelism& par) {
  uint64_t most = 0;
  for (const Stack& s : m.stacks) most = std::max(most, block_bytes(m, s, w, par));
  return most;
}

// Kept by forward: each stack's blocks (or, recomputed, only each block's
// output), what each stack keeps once, T5's score bias, and the LM head's
// part: a head run with the loss keeps its table's gradient (computed in
// forward, chunk by chunk); a head that forms its logits keeps them.
uint64_t kept_by_forward(const ModelShape& m, const Workload& w, const Parallelism& par) {
  const Tokens t = tokens_of(w);
  uint64_t a = 0;
  for (const Stack& s : m.stacks) {
    const uint64_t n = s.over_source ? t.source : t.target;
    const int64_t len = s.over_source ? t.source_len : t.target_len;
    const uint64_t block =
        par.recompute ? allocated(uint64_t(m.dim) * kF32 * n) : block_bytes(m, s, w, par);
    a += uint64_t(s.layers) * block + kept_bytes(s.once_per_token, n, w, par.mp);
    if (s.score_bias_heads > 0) {  // the bias [heads, T, T] and the bucket of each pair (i64)
      const uint64_t pairs = uint64_t(len) * uint64_t(len);
      a += allocated(uint64_t(s.score_bias_heads) * pairs * kF32) + allocated(pairs * 8);
    }
  }
  if (m.classes > 0) {  // [rows, d]: the first tokens, the pooler's tanh, dropout's mask
    const uint64_t rows = uint64_t(w.micro_batch);
    return a + 3 * allocated(rows * uint64_t(m.dim) * kF32) +
           allocated(rows * uint64_t(m.classes) * kF32) + allocated(rows * kF32);
  }
  const uint64_t rows = head_rows(m, par.mp), logits = allocated(t.target * rows * kF32);
  a += m.whole_logits ? logits                                     // the logits
                      : allocated(rows * uint64_t(m.dim) * kF32);  // the table's gradient
  if (vocab_split(m, par.mp))  // the head's input, copied as it enters the parallel region
    a += allocated(t.target * uint64_t(m.dim) * kF32);
  return a + allocated(t.target * kF32);  // the loss's log-sum-exp per row
}

uint64_t param_bytes(const ModelShape& m, int mp) {
  uint64_t b = 0;
  for (const shard::ParamSplit& p : m.resolve(mp)) b += uint64_t(shard_shape(p, mp).numel()) * kF32;
  return b;
}

// One block's parameters on average: everything but the vocabulary tables
// (the token embedding, and the LM head when it is a table of its own) over
// every stack's blocks.
uint64_t block_param_bytes(const ModelShape& m, int mp, uint64_t all) {
  const uint64_t tables =
      (m.classes > 0 || m.tied_head() ? 1 : 2) * head_rows(m, mp) * uint64_t(m.dim) * kF32;
  int64_t layers = 0;
  for (const Stack& s : m.stacks) layers += s.layers;
  return (all - std::min(all, tables)) / uint64_t(std::max<int64_t>(1, layers));
}

uint64_t state_per_param(Optimizer o) {
  switch (o) {
    case Optimizer::adamw:
      return 2;
    case Optimizer::sgd_momentum:
      return 1;
    case Optimizer::sgd:
      return 0;
  }
  return 2;
}

// What the LM head holds beyond the activations while it runs in forward
// (autodiff/ops_lm_head.cpp): a chunk of logits and its input, the final
// norm's output (alive until the head returns, then recomputed when
// needed); under Precision::bf16 also the table rounded (twice: one layout
// per product) and each chunk's logits gradient rounded for its products. A head that forms
// its logits whole (then adds a bias) holds them twice for a moment.
uint64_t head_transient(const ModelShape& m, const Workload& w, const Parallelism& par) {
  if (m.classes > 0) return 0;  // a classifier's head: a few [rows, d] buffers (kept_by_forward)
  const Tokens t = tokens_of(w);
  const uint64_t rows = head_rows(m, par.mp), d = uint64_t(m.dim);
  const uint64_t logits = t.target * rows * kF32;
  const uint64_t chunk = m.whole_logits ? logits : std::min(w.head_chunk_bytes, logits);
  if (vocab_split(m, par.mp)) return 4 * allocated(chunk) + allocated(t.target * d * kF32);
  uint64_t b = allocated(chunk) + allocated(t.target * d * kF32);
  // bf16: the chunk's gradient rounded, and the table rounded for the
  // logits' product and again, laid out for the input gradient's.
  if (w.precision == Precision::bf16) b += allocated(chunk) + 2 * allocated(rows * d * 2);
  return b;
}

// Backward of one block beyond what it keeps: the gradients of its widest
// sublayer (the MLP's hidden units) and the temporaries that sublayer's rule
// holds at once (model_shape.hpp, Stack::backward_width).
uint64_t backward_work(const ModelShape& m, const Workload& w, const Parallelism& par) {
  const Tokens t = tokens_of(w);
  uint64_t most = 0;
  for (const Stack& s : m.stacks) {
    const uint64_t n = s.over_source ? t.source : t.target;
    const int64_t width =
        s.backward_width % par.mp == 0 ? s.backward_width / par.mp : s.backward_width;
    most = std::max(most, allocated(uint64_t(width) * n * kF32));
  }
  return most;
}

}  // namespace

uint64_t activation_bytes_per_row(const ModelShape& model, const Workload& work,
                                  const Parallelism& par) {
  Workload one = work;
  one.micro_batch = 1;
  Parallelism whole = par;
  whole.recompute = false;
  return kept_by_forward(model, one, whole);
}

MemoryBreakdown training_memory(const ModelShape& m, const Workload& w, const Parallelism& par) {
  MemoryBreakdown r;
  const uint64_t p = param_bytes(m, par.mp);
  const bool sharded_grads = par.dp > 1 && par.zero >= 2;
  r.params = par.zero >= 3 && par.dp > 1 ? p / uint64_t(par.dp) : p;
  if (par.zero >= 3 && par.dp > 1)  // two blocks' parameters gathered: the one in use and the next
    r.gathered = 2 * block_param_bytes(m, par.mp, p);
  r.grads = sharded_grads ? p / uint64_t(par.dp) : p;
  // A head tied to the token embedding makes its whole table's gradient in
  // forward and finishes it only at the embedding, at backward's end: under
  // ZeRO-2 it is held whole until then, not this replica's part of it.
  if (sharded_grads && m.classes == 0 && m.tied_head()) {
    const uint64_t table = head_rows(m, par.mp) * uint64_t(m.dim) * kF32;
    r.grads += table - table / uint64_t(par.dp);
  }
  // With replicas, a bucket's all-reduce receives into a buffer of its own;
  // under ZeRO-2 up to two other owners' buckets are in flight as well.
  // Never more than there is to send: a model smaller than two buckets has
  // only the other owners' part of its gradients in flight.
  r.buckets = par.dp > 1 ? std::min<uint64_t>((sharded_grads ? 2 : 1) * par.bucket_bytes,
                                              sharded_grads ? p - p / uint64_t(par.dp) : p)
                         : 0;
  r.accumulated = w.accumulation > 1 ? r.grads : 0;
  r.opt_state =
      state_per_param(w.optimizer) * (par.zero >= 1 && par.dp > 1 ? p / uint64_t(par.dp) : p);
  r.activations = kept_by_forward(m, w, par);
  r.forward_peak = head_transient(m, w, par);
  r.block = largest_block(m, w, par);
  r.backward_peak = backward_work(m, w, par);
  return r;
}

uint64_t MemoryBreakdown::peak() const {
  const uint64_t lasting = params + gathered + opt_state + accumulated;
  // Three candidates for the high-water mark: the LM head at the end of
  // forward; the top block's backward, with every activation still held;
  // the bottom block's, with every gradient made (under recomputation its
  // activations made again first). The optimizer's update needs no more than
  // the last (it works in place).
  const uint64_t head = activations + forward_peak;
  const uint64_t top = activations + backward_peak;
  const uint64_t bottom = grads + buckets + block + backward_peak;
  return lasting + std::max({head, top, bottom});
}

std::string describe(const MemoryBreakdown& m) {
  constexpr double kMiB = 1024.0 * 1024.0;
  auto mib = [&](uint64_t b) { return double(b) / kMiB; };
  return fmt::format(
      "params {:.1f} MiB, grads {:.1f} MiB, optimizer state {:.1f} MiB, activations {:.1f} MiB, "
      "peak {:.1f} MiB",
      mib(m.params), mib(m.grads + m.buckets), mib(m.opt_state), mib(m.activations), mib(m.peak()));
}

}  // namespace redco::plan
