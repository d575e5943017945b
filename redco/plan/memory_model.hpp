#pragma once
// The memory of one training step on one rank, from the model's shape
// (plan/model_shape.hpp) and the run's configuration, without running it:
// parameters, gradients, optimizer state, the activations kept for backward
// (with and without recomputation), the LM head's buffers, the data-parallel
// buckets and backward's workspace. (The allocator's fragmentation is the
// planner's margin on top: plan/planner.hpp.)
//
//   MemoryBreakdown m = training_memory(shape, {.seq_len = 1024, .micro_batch = 4},
//                                       {.dp = 2, .mp = 2, .zero = 2});
//   m.peak()  // bytes the caching allocator holds at the step's high-water mark
//
// The parts are the ones fit()'s first-step memory report measures
// (train/memory_account.hpp): params, grads, opt_state and activations are
// its fields, peak() the allocator's high-water mark over a step.
// tests/test_memory_model runs every family and checks each part.
#include <cstdint>
#include <string>

#include "redco/core/dtype.hpp"
#include "redco/plan/model_shape.hpp"

namespace redco::plan {

enum class Optimizer : uint8_t { adamw, sgd_momentum, sgd };

// What one step computes. Designated initialisers name these fields in the order declared below.
struct Workload {
  int64_t seq_len = 512;     // tokens per row (the target's, for an encoder-decoder)
  int64_t source_len = 0;    // an encoder-decoder's source tokens per row; 0: seq_len
  int64_t micro_batch = 1;   // rows per replica per micro-batch
  int64_t accumulation = 1;  // micro-batches per optimizer step
  Precision precision = Precision::f32;
  Optimizer optimizer = Optimizer::adamw;
  // The LM head's logits per chunk (autodiff/ops_lm_head.cpp): 64 MiB on the
  // CPU, 512 MiB on a GPU.
  uint64_t head_chunk_bytes = uint64_t(64) << 20;
};

// How the step is spread. Designated initialisers name these fields in the order declared below.
struct Parallelism {
  int dp = 1;                                  // data-parallel replicas
  int mp = 1;                                  // model shards (tensor parallelism)
  int zero = 0;                                // ZeRO stage over the replicas: 0-3
  bool recompute = false;                      // FitOptions::recompute
  uint64_t bucket_bytes = uint64_t(25) << 20;  // DeployerConfig::grad_bucket_bytes
};

struct MemoryBreakdown {
  uint64_t params = 0;        // this rank's parameters (f32), ZeRO-3: its partition
  uint64_t gathered = 0;      // ZeRO-3: the layers' parameters gathered at once (prefetch included)
  uint64_t grads = 0;         // the gradients held after backward (ZeRO-2/3: this rank's part)
  uint64_t buckets = 0;       // data-parallel buckets in flight beyond `grads` (receive buffers)
  uint64_t accumulated = 0;   // the sum of micro-batch gradients (accumulation > 1)
  uint64_t opt_state = 0;     // the optimizer's buffers (ZeRO >= 1: this rank's part)
  uint64_t activations = 0;   // kept by forward for backward (the LM head's included)
  uint64_t forward_peak = 0;  // beyond activations, what the LM head holds while it runs
  uint64_t block = 0;         // one block's kept activations (recomputed: made again in backward)
  uint64_t backward_peak = 0;  // beyond what is kept, one block's backward at its widest
  // The step's high-water mark: what lives across steps, plus the largest of
  // forward's end, backward's worst point and the optimizer's update.
  uint64_t peak() const;
};

MemoryBreakdown training_memory(const ModelShape& model, const Workload& work,
                                const Parallelism& par);

// Bytes forward keeps per row (one sequence), without recomputation: the
// activations' slope in the micro-batch.
uint64_t activation_bytes_per_row(const ModelShape& model, const Workload& work,
                                  const Parallelism& par);

// "params 474.7 MiB, grads ..., peak ..." on one line.
std::string describe(const MemoryBreakdown& m);

}  // namespace redco::plan
