#pragma once
// Where a rank's memory goes in training: its parameters, one step's
// gradients, the optimizer's state, the activations backward reads, and the
// caching allocator's slack (free memory it keeps for reuse). fit() measures
// them on its first step (the peak over its first two, so that the optimizer's
// state is held through a whole step), prints one line per rank and writes them to
// metrics.jsonl (split "memory": rank<r>.params_mib, .grads_mib,
// .opt_state_mib, .activations_mib, .slack_mib, .grad_peak_mib, .peak_mib
// for every rank r).
//
// The allocator figures (activations, slack) are the CPU caching allocator's, which every thread of
// a process shares: with ranks on threads (comm::ThreadsWorld) they are all ranks' together, each
// rank reading about the same total; with one rank per process (redco-run) they are the rank's own.
#include <cstdint>
#include <string>
#include <vector>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/io/events.hpp"

namespace redco::comm {
class Comm;
}

namespace redco::train {

struct MemoryAccount {
  uint64_t params = 0;     // this rank's parameters (its shards under model parallelism)
  uint64_t grads = 0;      // the gradients of one micro-batch
  uint64_t opt_state = 0;  // the optimizer's buffers held by this rank
  // What the caching allocator holds at the end of forward beyond what it
  // held when forward began: the activations saved for backward.
  uint64_t activations = 0;
  uint64_t slack = 0;  // free bytes the caching allocator keeps after the step
  // The most gradient bytes held at once from backward until the gradients
  // are averaged: with several replicas what the data-parallel buckets hold
  // (DataParallel::last_grad_peak), else the gradients themselves. ZeRO-2
  // lowers it to about 1/dp plus the buckets in flight.
  uint64_t grad_peak = 0;
  // The caching allocator's high-water mark up to the end of the second step
  // (the first when fit() takes one): what the rank needed at once, which
  // plan::training_memory(...).peak() models.
  uint64_t peak = 0;
};

// The bytes the CPU caching allocator has handed out since this was made
// (beyond those it had then): what a stretch of computation keeps alive.
class AllocatorDelta {
 public:
  explicit AllocatorDelta(Device device = Device::cpu());
  uint64_t bytes() const;

 private:
  Device device_;
  size_t held_;
};

// What a training step measures of itself on the first step.
struct StepMemory {
  uint64_t activations = 0;  // AllocatorDelta over forward
  uint64_t grad_peak = 0;    // MemoryAccount::grad_peak
};

// Starts the high-water mark that MemoryAccount::peak reads afresh (the CPU's
// caching allocator and the test device's pool; a GPU's pool keeps its own
// since the process began). fit() calls it as its first step begins. With
// ranks on threads the allocator, and so its mark, is all ranks' together.
void reset_peak(Device device);

// This rank's account now; slack and peak are read from the allocator of `device`.
MemoryAccount account_now(const ParamTree& params, const ParamTree& grads,
                          const ParamTree& opt_state, uint64_t activations,
                          Device device = Device::cpu());

// Bytes of every tensor of `tree` (views counted at their own size).
uint64_t tree_bytes(const ParamTree& tree);

// Every rank's account, indexed by world rank (just `mine` without a world).
// Collective over `world`.
std::vector<MemoryAccount> gather_accounts(const MemoryAccount& mine, comm::Comm* world);

// "rank<r>.<part>_mib" for every rank r and part.
io::Metrics memory_metrics(const std::vector<MemoryAccount>& ranks);

// "memory rank 0: params 474.7 MiB, grads ..., opt state ..., activations ..., slack ..."
std::string describe(const MemoryAccount& a, int rank);

}  // namespace redco::train
