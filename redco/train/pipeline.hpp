#pragma once
// Batches are collated one step ahead on the oneTBB pool, so the CPU cores
// that are not busy with the current step's kernels build the next batch and
// the step never waits for data (unless collation is slower than compute).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <ranges>
#include <span>
#include <utility>
#include <vector>

#include "redco/autodiff/node.hpp"

namespace redco::train::detail {

// One task at a time on the oneTBB pool (pipeline.cpp keeps TBB out of this
// header, which every program using the Trainer compiles). The task is a
// function pointer and its argument, so starting one allocates nothing here.
// The destructor waits for a running task however the scope is left: an
// exception from the step must not destroy the batch slot under it.
class BackgroundTask {
 public:
  BackgroundTask();
  ~BackgroundTask();
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;
  void run(void (*fn)(void*), void* arg);
  void wait();  // rethrows the task's exception

 private:
  struct Impl;
  Impl* impl_;
};

// Calls use(i, batch) for i in [0, n) in order, with batch = make(i); make(i + 1)
// runs concurrently with use(i). make must not touch what use changes. A
// use() returning false stops the loop (the batch being built is discarded).
template <typename Batch, typename Make, typename Use>
void pipelined(int64_t n, Make&& make, Use&& use) {
  if (n <= 0) return;
  std::optional<Batch> next;
  int64_t next_index = 0;
  // Grad mode is per thread and the task may run on any thread, even this
  // one while it waits inside a kernel: collation never records history.
  auto build = [&](int64_t i) {
    NoGradGuard off;
    return make(i);
  };
  auto build_next = [&] { next.emplace(build(next_index)); };
  using BuildNext = decltype(build_next);
  BackgroundTask task;  // declared after `next`: destroyed (joined) first
  std::optional<Batch> current(build(0));
  for (int64_t i = 0; i < n; ++i) {
    if (i + 1 < n) {
      next_index = i + 1;
      task.run([](void* f) { (*static_cast<BuildNext*>(f))(); }, &build_next);
    }
    if (!use(i, *current)) return;
    if (i + 1 < n) {
      task.wait();  // rethrows a collate error here, in order
      current.emplace(std::move(*next));
      next.reset();
    }
  }
}

// The examples at order[0, n) of a random-access range, copied into one
// contiguous vector so collate sees a span whatever the source range is.
template <typename R>
auto gather(const R& examples, std::span<const int64_t> order) {
  std::vector<std::ranges::range_value_t<const R>> out;
  out.reserve(order.size());
  const auto first = std::ranges::begin(examples);
  for (int64_t i : order) out.push_back(first[i]);
  return out;
}

// The examples [begin, begin + n) of a random-access range, copied likewise.
template <typename R>
auto gather_range(const R& examples, int64_t begin, int64_t n) {
  std::vector<std::ranges::range_value_t<const R>> out;
  out.reserve(size_t(n));
  const auto first = std::ranges::begin(examples) + begin;
  for (int64_t i = 0; i < n; ++i) out.push_back(first[i]);
  return out;
}

// An evaluation or prediction pass over n examples as one data-parallel
// replica sees it: batch b covers examples [b * B, (b + 1) * B) (B =
// per_device × dp; the last batch may be partial) and replica r takes
// [b * B + r * per_device, ...) of it, clipped to n. The batches a replica
// has examples in are a prefix of them; it skips the rest (nothing passes
// between replicas per batch, and a model-parallel group shares one replica's
// slices, so its ranks skip together).
class Slices {
 public:
  Slices(int64_t n, int64_t per_device, int64_t dp, int64_t rank)
      : n_(n), per_device_(per_device), dp_(dp), rank_(rank) {}
  int64_t count() const { return count(rank_); }
  int64_t count(int64_t rank) const {
    const int64_t skip = rank * per_device_, batch = per_device_ * dp_;
    return n_ <= skip ? 0 : (n_ - skip + batch - 1) / batch;
  }
  int64_t begin(int64_t b) const { return begin(b, rank_); }
  int64_t begin(int64_t b, int64_t rank) const { return (b * dp_ + rank) * per_device_; }
  int64_t size(int64_t b) const { return size(b, rank_); }
  int64_t size(int64_t b, int64_t rank) const {
    return std::clamp<int64_t>(n_ - begin(b, rank), 0, per_device_);
  }
  // Keys batch b's randomness: b itself with one replica.
  int64_t id(int64_t b) const { return b * dp_ + rank_; }
  int64_t replicas() const { return dp_; }

 private:
  int64_t n_, per_device_, dp_, rank_;
};

}  // namespace redco::train::detail
