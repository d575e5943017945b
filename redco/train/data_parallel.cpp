#include "redco/train/data_parallel.hpp"

#include <algorithm>
#include <coroutine>
#include <exception>
#include <map>

#include "redco/core/error.hpp"
#include "redco/autodiff/functional.hpp"
#include "redco/sched/run_queue.hpp"

namespace redco::train {

// ---- data parallel ----------------------------------------------------------------------

DataParallel::DataParallel(dist::Comm& dp, size_t bucket_bytes)
    : dp_(&dp), bucket_bytes_(std::max<size_t>(bucket_bytes, 1)) {}

DataParallel::~DataParallel() = default;

Tensor DataParallel::local_batch(const Tensor& global) const {
  const int n = dp_->size();
  REDCO_CHECK(global.rank() >= 1 && global.dim(0) % n == 0,
              "DataParallel: a global batch of {} rows does not split across {} replicas; use a "
              "multiple of {}",
              global.rank() >= 1 ? global.dim(0) : 0, n, n);
  const int64_t m = global.dim(0) / n;
  return global.slice0(dp_->rank() * m, (dp_->rank() + 1) * m).clone();
}

namespace {

// One bucket: its gradients packed into a flat buffer that is all-reduced at once.
struct Bucket {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  Tensor flat;
  size_t arrived = 0;
};

struct Slot {
  size_t bucket;
  int64_t offset;  // into the bucket's flat buffer
};

// A started coroutine that nobody awaits: it runs until its first suspension
// and frees itself when it ends.
struct Detached {
  struct promise_type {
    Detached get_return_object() const noexcept { return {}; }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    std::suspend_never final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }
  };
};

}  // namespace

// The step's reductions suspend on `queue` (not on a sync_wait's queue), so
// whoever completes them posts them back here and finish() resumes them on
// this rank's thread.
struct DataParallel::Step {
  std::vector<Bucket> buckets;
  std::map<std::string, Slot> slots;
  sched::RunQueue queue;
  int outstanding = 0;
  bool sealed = false;
  size_t launched = 0;
  std::exception_ptr error;
};

namespace {

Detached run_reduction(sched::Task<void> reduction, DataParallel::Step* step) {
  try {
    co_await std::move(reduction);
  } catch (...) {
    if (!step->error) step->error = std::current_exception();
  }
  if (--step->outstanding == 0 && step->sealed) step->queue.finish();
}

// Starts bucket b's mean all-reduce. Every dp rank builds the same buckets
// and completes them in the same order (the same graph runs backward in the
// same order), so the k-th all_reduce call pairs with the k-th everywhere.
void launch(DataParallel::Step& step, size_t b, dist::Comm& dp) {
  ++step.outstanding;
  ++step.launched;
  sched::RunQueue*& current = sched::RunQueue::current();
  sched::RunQueue* const outer = std::exchange(current, &step.queue);
  run_reduction(dp.all_reduce(step.buckets[b].flat, dist::ReduceOp::mean), &step);
  current = outer;
}

// Copies a final gradient into its bucket; the bucket's last one starts it.
void arrive(DataParallel::Step& step, const std::string& name, const Tensor& g, dist::Comm& dp) {
  const Slot& s = step.slots.at(name);
  Bucket& b = step.buckets[s.bucket];
  const Tensor src = g.dtype() == DType::f32 ? g.detach() : g.to(DType::f32);
  std::copy_n(src.data<float>(), src.numel(), b.flat.data<float>() + s.offset);
  if (++b.arrived == b.names.size()) launch(step, s.bucket, dp);
}

}  // namespace

void DataParallel::begin(const ParamTree& shapes, const std::vector<std::string>& order) {
  REDCO_CHECK(!step_, "DataParallel: finish() the previous step before starting another");
  REDCO_CHECK(order.size() == shapes.size(),
              "DataParallel: {} parameters but {} names in the order", shapes.size(), order.size());
  step_ = std::make_unique<Step>();
  Bucket pending;
  int64_t numel = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    auto found = shapes.find(*it);
    REDCO_CHECK(found != shapes.end(), "DataParallel: no parameter '{}'", *it);
    step_->slots[*it] = {step_->buckets.size(), numel};
    pending.names.push_back(*it);
    pending.shapes.push_back(found->second.shape());
    numel += found->second.numel();
    if (size_t(numel) * sizeof(float) >= bucket_bytes_ || std::next(it) == order.rend()) {
      pending.flat = Tensor::zeros(Shape{numel});  // an unused parameter's gradient is 0
      step_->buckets.push_back(std::move(pending));
      pending = Bucket{};
      numel = 0;
    }
  }
}

ParamTree DataParallel::watch(const ParamTree& params, const std::vector<std::string>& order) {
  begin(params, order);
  Step* step = step_.get();
  dist::Comm* dp = dp_;
  ParamTree out;
  for (const auto& [name, p] : params) {
    // An identity op on the parameter: the engine runs its backward once the
    // gradient reaching the parameter is complete, which is the moment to hand
    // it to its bucket.
    // A named copy: clang 14 cannot capture a structured binding.
    const std::string key = name;
    out.emplace(key, record("grad_ready", {p}, p.detach(),
                            [step, dp, key](const Node&, const TensorList& g) -> TensorList {
                              arrive(*step, key, g[0], *dp);
                              return {g[0]};
                            }));
  }
  return out;
}

void DataParallel::finish(ParamTree& grads) {
  REDCO_CHECK(step_, "DataParallel::finish: no step in flight (call watch() or average())");
  std::unique_ptr<Step> step = std::move(step_);
  last_early_ = step->launched;
  // Gradients that never reached a hook (backward did not run) go now, in
  // bucket order, which is the same on every rank.
  for (size_t b = 0; b < step->buckets.size(); ++b) {
    Bucket& bucket = step->buckets[b];
    if (bucket.arrived == bucket.names.size()) continue;
    for (size_t i = 0; i < bucket.names.size(); ++i)
      if (const Tensor& g = grads.at(bucket.names[i]); g.defined())
        std::copy_n(g.to(DType::f32).data<float>(), g.numel(),
                    bucket.flat.data<float>() + step->slots.at(bucket.names[i]).offset);
    bucket.arrived = bucket.names.size();
    launch(*step, b, *dp_);
  }
  step->sealed = true;
  if (step->outstanding > 0) step->queue.drain();
  if (step->error) std::rethrow_exception(step->error);
  for (const Bucket& b : step->buckets) {
    const float* src = b.flat.data<float>();
    for (size_t i = 0; i < b.names.size(); ++i) {
      Tensor g = Tensor::empty(b.shapes[i]);
      std::copy_n(src, g.numel(), g.data<float>());
      src += g.numel();
      grads[b.names[i]] = g;
    }
  }
  last_buckets_ = step->buckets.size();
}

void DataParallel::average(ParamTree& grads, const std::vector<std::string>& order) {
  begin(grads, order);
  finish(grads);
  last_early_ = 0;
}

}  // namespace redco::train
