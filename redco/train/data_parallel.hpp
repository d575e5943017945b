#pragma once
// Data parallelism: each replica takes its rows of the global batch and the
// gradients are averaged across replicas in buckets, each bucket's all-reduce
// started as soon as backward has finalised its last gradient.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/comm.hpp"
#include "redco/core/error.hpp"
#include "redco/train/zero.hpp"

namespace redco::train {

// ---- data parallel ----------------------------------------------------------------------

class DataParallel {
 public:
  // Gradients are all-reduced in buckets of at least `bucket_bytes` (f32).
  explicit DataParallel(comm::Comm& dp, size_t bucket_bytes = size_t(25) << 20);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // This replica's rows of a global batch (dim 0 must divide by the dp size).
  Tensor local_batch(const Tensor& global) const;

  // Overlapping the gradient all-reduce with backward: call inside the loss
  // function on the parameters it receives and compute with the result,
  //   value_and_grad([&](const ParamTree& p) { return loss(dp.watch(p, order)); }, params);
  // Buckets are filled in reverse `order` (execution order: backward finishes
  // the last layers' gradients first), and as backward finalises the last
  // gradient of a bucket, that bucket's all-reduce is started. Then
  // finish(grads) awaits them all and replaces every gradient by its mean over
  // the dp group, ready for the optimizer step.
  // The hooks keep no gradient: backward hands each to its bucket and the
  // parameter's own gradient stays undefined (value_and_grad below does not
  // turn it into zeros), so a replica never holds its full-size gradients
  // and the buckets' at once.
  ParamTree watch(const ParamTree& params, const std::vector<std::string>& order);
  void finish(ParamTree& grads);

  // value_and_grad(f, params) with the parameters watched and the step
  // finished: the loss and the averaged gradients (under ZeRO-2 this
  // replica's own only). f(const ParamTree&) -> scalar Tensor.
  template <typename F>
  std::pair<Tensor, ParamTree> value_and_grad(F&& f, const ParamTree& params,
                                              const std::vector<std::string>& order) {
    ParamTree leaves;
    TensorList inputs;
    for (const auto& [name, p] : params) {
      Tensor leaf = p.detach().set_requires_grad(true).set_name(name);
      leaves.emplace(name, leaf);
      inputs.push_back(leaf);
    }
    Tensor loss(f(watch(leaves, order)));
    REDCO_CHECK(loss.defined() && loss.numel() == 1,
                "value_and_grad: the function must return a scalar loss, got shape {}",
                loss.defined() ? loss.shape() : Shape{});
    grad({loss}, inputs, {}, {.allow_unused = true});  // the hooks take every gradient
    ParamTree grads;
    finish(grads);
    return {loss, std::move(grads)};
  }

  // The same averaging for gradients computed without watch(): all buckets
  // are started at once.
  void average(ParamTree& grads, const std::vector<std::string>& order);

  // ZeRO-3 (ParamGather): a step whose gradients the caller hands over one
  // by one as backward completes them (each whole, of `shapes`), then
  // finish(grads) as after watch().
  void start(const std::map<std::string, Shape>& shapes, Device device,
             const std::vector<std::string>& order);
  void hand_over(const std::string& name, const Tensor& grad);

  // ZeRO stage 2: each gradient is averaged into its owner only (buckets hold
  // one owner's parameters and are sent to it instead of all-reduced), and
  // finish() leaves in `grads` only the gradients this replica owns. The mean
  // is formed as the threads communicator's all-reduce forms it (ranks in
  // order, then the division). A bucket's buffer exists from its first
  // gradient until it is sent (another replica's) or reduced (its own), and
  // backward waits for the bucket launched two owner buckets before (whose
  // peers are about as far), so a replica holds its own part of the
  // gradients plus a few buckets in flight, not every gradient.
  // nullptr: all-reduce (the default).
  void reduce_to_owners(const ZeroPartition* owners) { owners_ = owners; }

  // Of the last step: how many buckets, and how many were started by backward.
  size_t last_bucket_count() const { return last_buckets_; }
  size_t last_early_launches() const { return last_early_; }
  // Of the last step: the most bytes its buckets held at once (gradients
  // copied in, parts received from other replicas), counted buffer by buffer.
  uint64_t last_grad_peak() const { return last_peak_; }

  struct Step;  // the buckets of the step in flight

 private:
  void begin(const std::map<std::string, Shape>& shapes, Device device,
             const std::vector<std::string>& order);
  void begin(const ParamTree& params, const std::vector<std::string>& order);

  comm::Comm* dp_;
  size_t bucket_bytes_;
  const ZeroPartition* owners_ = nullptr;
  std::unique_ptr<Step> step_;
  size_t last_buckets_ = 0, last_early_ = 0;
  uint64_t last_peak_ = 0;
};

}  // namespace redco::train
