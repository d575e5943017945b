#pragma once
// The search: every way to run a training step on a cluster (model shards x
// replicas, ZeRO stage, recomputation, micro-batch and accumulation), each
// with its per-rank memory (plan/memory_model.hpp) and modelled time
// (plan/time_model.hpp); those that fit, fastest first.
//
//   Request r{.model = shape, .cluster = cluster, .seq_len = 1024, .global_batch = 32};
//   std::vector<Candidate> plans = plan::search(r);   // plans[0]: the one to run
//
// A plan fits when its peak plus the allocator's fragmentation margin plus
// what the device's runtime takes (a CUDA context) is within its memory. Tensor parallelism needs
// the plan's split to exist: a shard count under which the model's attention heads or MLP do not
// divide still runs (those blocks replicated), and the memory model counts
// them whole.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redco/plan/time_model.hpp"

namespace redco::plan {

// Designated initialisers name these fields in the order declared below.
struct Request {
  ModelShape model;
  Cluster cluster;
  int64_t seq_len = 512;
  int64_t source_len = 0;    // encoder-decoder source; 0: seq_len
  int64_t global_batch = 0;  // rows per optimizer step over all replicas; 0: one per replica
  Precision precision = Precision::f32;
  Optimizer optimizer = Optimizer::adamw;
  // What the search may choose; a set field pins it.
  std::optional<int> mp = {};          // model shards
  std::optional<int> zero = {};        // ZeRO stage
  std::optional<bool> recompute = {};  // activation recomputation
  std::optional<int64_t> micro_batch = {};
  // The highest ZeRO stage searched. Stage 3 gathers every parameter twice a
  // step, so the time model ranks it last unless nothing else fits.
  int max_zero = 3;
};

struct Candidate {
  Workload work;
  Parallelism par;
  MemoryBreakdown memory;
  StepTime time;
  uint64_t needed = 0;  // peak plus the fragmentation margin
  bool fits = false;
};

// Every candidate the request allows: the fitting ones first, most tokens per
// second first; then the misses, nearest first.
std::vector<Candidate> search(const Request& r);
// The best plan that fits, if any.
std::optional<Candidate> best(const Request& r);
// The longest sequence (a multiple of 64, one row per replica) some plan of
// the request fits at, at most the model's position table (ModelShape::context);
// 0 when none fits 64 tokens.
int64_t max_seq_len(Request r);

// The memory one candidate needs on one rank (its peak plus the margin).
uint64_t needed_bytes(const MemoryBreakdown& m);

// A size as a user writes it: 40GB (10^9 bytes), 40GiB or 40G (2^30), 512MB,
// 512MiB or 512M, 1TB. Fails naming `flag` and the forms it takes.
uint64_t parse_size(const std::string& text, std::string_view flag);

// "6.42 GiB", "512.0 MiB".
std::string bytes_text(uint64_t bytes);

// "params 1.56 GiB + optimizer state 3.13 GiB + step 1.94 GiB (activations
// 1.31, gradients 1.56) = 6.63 GiB per rank": a candidate's need in words.
std::string describe_need(const Candidate& k);

}  // namespace redco::plan
