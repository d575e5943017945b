#pragma once
// Data parallelism: each replica takes its rows of the global batch and the
// gradients are averaged across replicas in buckets, each bucket's all-reduce
// started as soon as backward has finalised its last gradient.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/comm.hpp"
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
  ParamTree watch(const ParamTree& params, const std::vector<std::string>& order);
  void finish(ParamTree& grads);

  // The same averaging for gradients computed without watch(): all buckets
  // are started at once.
  void average(ParamTree& grads, const std::vector<std::string>& order);

  // ZeRO stage 2: each gradient is averaged into its owner only (buckets hold
  // one owner's parameters and are sent to it instead of all-reduced), and
  // finish() leaves in `grads` only the gradients this replica owns. The mean
  // is formed as the threads communicator's all-reduce forms it (ranks in
  // order, then the division). nullptr: all-reduce (the default).
  void reduce_to_owners(const ZeroPartition* owners) { owners_ = owners; }

  // Of the last step: how many buckets, and how many were started by backward.
  size_t last_bucket_count() const { return last_buckets_; }
  size_t last_early_launches() const { return last_early_; }

  struct Step;  // the buckets of the step in flight

 private:
  void begin(const ParamTree& shapes, const std::vector<std::string>& order);

  comm::Comm* dp_;
  size_t bucket_bytes_;
  const ZeroPartition* owners_ = nullptr;
  std::unique_ptr<Step> step_;
  size_t last_buckets_ = 0, last_early_ = 0;
};

}  // namespace redco::train
