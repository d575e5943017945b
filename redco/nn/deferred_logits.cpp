// An LM head's logits, deferred until the loss reads them (see
// vocab_head_logits in tensor_parallel.hpp).
//
// In training the logits of a language model feed one op: the loss. Formed
// whole they are the largest buffer of the step ([tokens, vocab]: 412 MB for
// GPT-2 at 2048 tokens), alive from the head's forward to its backward. The
// head returns instead a tensor with the logits' shape and no values, whose
// placement remembers (h, table): cross_entropy sees the placement and runs
// linear_cross_entropy, which forms the logits a chunk of rows at a time.
// Any other read fails like a split tensor's does, naming nn::whole(), which
// forms the logits (differentiably): prediction code (eval) never sees a
// deferred tensor, since deferral needs ctx.train and a recorded gradient.
#include <fmt/format.h>

#include "redco/autodiff/loss_on_parts.hpp"
#include "redco/nn/parallel_ops.hpp"
#include "redco/nn/tensor_parallel.hpp"

namespace redco::nn {
namespace {

// `mp` set: a vocabulary-split head's logits, this rank's columns [..., V/mp]:
// cross_entropy runs vocab_parallel_linear_cross_entropy, nn::whole forms
// this rank's columns and gathers every rank's.
class DeferredLogits final : public Placement, public CrossEntropyOnParts {
 public:
  DeferredLogits(Tensor h, Tensor table, comm::Comm* mp)
      : h_(std::move(h)), table_(std::move(table)), mp_(mp) {}

  std::string describe() const override {
    const std::string which =
        mp_ ? fmt::format("this rank's {} vocabulary columns (of {} model-parallel ranks) of ",
                          table_.dim(0), mp_->size())
            : std::string();
    return fmt::format(
        "{}the LM head's logits {} x {}^T, not formed yet (they are formed a chunk at a time "
        "by the loss)",
        which, h_.shape(), table_.shape());
  }
  std::string read_hint() const override {
    return "Call nn::whole(t) to form them (cross_entropy takes them as they are, without "
           "forming them whole), or set ctx.split_output = nn::Ctx::SplitOutput::never";
  }
  bool holds_values() const override { return false; }
  Tensor whole(const Tensor& t) const override {
    return mp_ ? gather_from_parallel(part(t), *mp_, t.rank() - 1) : part(t);
  }
  // This rank's logits (all of them without a split), formed differentiably.
  Tensor part(const Tensor& t) const {
    return reshape(matmul(h_, table_, false, true), check_layout(t, "forming them"));
  }
  bool split() const { return mp_ != nullptr; }
  Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                       int64_t ignore_index) const override {
    check_layout(logits, "cross_entropy");
    REDCO_CHECK(labels.shape() == logits.shape().drop(-1),
                "cross_entropy: logits {} need labels of shape {}, got {}", logits.shape(),
                logits.shape().drop(-1), labels.shape());
    const Tensor rows = labels.view(h_.shape().drop(-1));
    return mp_ ? vocab_parallel_linear_cross_entropy(h_, table_, rows, *mp_, ignore_index)
               : linear_cross_entropy(h_, table_, rows, ignore_index);
  }

 private:
  // A view that keeps the vocabulary as its last dim and every row keeps the
  // rows' order; a slice or a reshape across the vocabulary does not.
  Shape check_layout(const Tensor& t, const char* op) const {
    const int64_t vocab = table_.dim(0);
    REDCO_CHECK(t.impl().offset == 0 && t.rank() >= 1 && t.shape().last() == vocab &&
                    t.numel() == h_.numel() / h_.shape().last() * vocab,
                "{}: a tensor of shape {} was {}, but has been sliced or reshaped since; call "
                "nn::whole() on the model output before reshaping it",
                op, t.shape(), describe());
    return t.shape();
  }
  Tensor h_, table_;
  comm::Comm* mp_;  // nullptr: the whole table is here
};

}  // namespace

Tensor form_split_logits(const Tensor& t) {
  const auto* p = dynamic_cast<const DeferredLogits*>(t.placement());
  return p && p->split() ? p->part(t) : t;
}

Tensor vocab_head_logits(const Tensor& h, const Tensor& table, const Ctx& ctx) {
  const bool keep = ctx.split_output == Ctx::SplitOutput::always ||
                    (ctx.split_output == Ctx::SplitOutput::in_training && ctx.train);
  if (!keep || !needs_graph({h, table})) return matmul(h, table, false, true);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>();  // no values: nothing is allocated
  impl->storage->owned = false;
  impl->storage->device = h.device();
  impl->shape = h.shape().with(-1, table.dim(0));
  impl->dtype = DType::f32;
  // Split by vocabulary: this rank's columns [..., V/mp].
  impl->placement =
      std::make_shared<DeferredLogits>(h, table, ctx.split_features ? ctx.mp : nullptr);
  return Tensor(std::move(impl));
}

}  // namespace redco::nn
