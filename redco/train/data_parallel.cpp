#include "redco/train/data_parallel.hpp"

#include <algorithm>
#include <coroutine>
#include <deque>
#include <exception>
#include <map>

#include "redco/autodiff/functional.hpp"
#include "redco/core/error.hpp"
#include "redco/core/profile.hpp"
#include "redco/ops/backend.hpp"
#include "redco/sched/background.hpp"
#include "redco/sched/run_queue.hpp"

namespace redco::train {

// ---- data parallel ----------------------------------------------------------------------

DataParallel::DataParallel(comm::Comm& dp, size_t bucket_bytes)
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

// Bytes of bucket buffers held now, and the most held at once.
struct Held {
  int64_t now = 0, peak = 0;
  void add(int64_t bytes) { peak = std::max(peak, now += bytes); }
  void sub(int64_t bytes) { now -= bytes; }
};

// One bucket: its gradients packed into a flat buffer that is all-reduced at once.
struct Bucket {
  // One entry per gradient, or per part of a gradient split among ZeRO owners
  // (rows [rows.first, rows.second) of dim 0; whole: {0, dim 0}).
  std::vector<std::string> names;
  std::vector<Shape> shapes;  // of the entry
  std::vector<std::pair<int64_t, int64_t>> rows;
  int64_t numel = 0;
  Tensor flat;  // [numel], made on the gradients' device when the first one arrives
  Device device = Device::cpu();
  size_t arrived = 0;
  int owner = -1;  // ZeRO stage 2: the replica that receives the mean; -1: all-reduced
  // Where the bucket's reduction suspends (made at launch): whoever completes
  // it posts it back here, and this rank's thread resumes it by draining the
  // queue, which returns once the reduction has ended.
  std::unique_ptr<sched::RunQueue> queue;
};

struct Slot {
  size_t bucket;
  int64_t offset;                    // into the bucket's flat buffer
  std::pair<int64_t, int64_t> rows;  // of the gradient, dim 0
};

// ZeRO-2 buckets whose reductions may still be in flight while backward
// starts another; beyond this many the oldest is waited for.
constexpr size_t kInFlight = 2;

}  // namespace

struct DataParallel::Step {
  std::vector<Bucket> buckets;
  std::map<std::string, std::vector<Slot>> slots;  // a gradient's parts (one when whole)
  std::deque<size_t> in_flight;  // ZeRO-2 buckets launched by backward, not yet waited for
  size_t launched = 0;
  Held held;
  std::exception_ptr error;
};

namespace {

sched::Detached run_reduction(sched::Task<void> reduction, DataParallel::Step* step,
                              Bucket* bucket) {
  try {
    co_await std::move(reduction);
  } catch (...) {
    if (!step->error) step->error = std::current_exception();
  }
  bucket->queue->finish();
}

constexpr int kOwnerTag = 3664;  // point-to-point tag of ZeRO-2 gradient sends (UCX: < 4096)

// ZeRO stage 2: the bucket's mean formed at its owner only: the others send
// their part, the owner sums the parts in rank order and divides, as the
// threads communicator's all-reduce does. A sender lets go of its buffer
// once the send has completed.
sched::Task<void> reduce_to_owner(Bucket& b, comm::Comm& dp, Held& held) {
  const int n = dp.size(), me = dp.rank();
  const int64_t bytes = b.numel * int64_t(sizeof(float));
  if (me != b.owner) {
    const Tensor data = std::move(b.flat);
    co_await dp.send(data, b.owner, kOwnerTag);
    held.sub(bytes);
    co_return;
  }
  std::vector<Tensor> parts(static_cast<size_t>(n));  // [n] of [numel]
  // Every receive is posted before any is awaited: a message is matched by
  // its order among those from the same peer, which must be the order in
  // which this rank's buckets launch, not the order in which they resume.
  std::vector<sched::Task<void>> receives;
  held.add(bytes * (n - 1));
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    parts[size_t(r)] = Tensor::empty(b.flat.shape(), DType::f32, b.device);
    receives.push_back(dp.recv(parts[size_t(r)], r, kOwnerTag));
  }
  for (auto& t : receives) co_await std::move(t);
  parts[size_t(me)] = std::move(b.flat);
  // Summed into rank 0's part (a buffer of this rank's: its own or one
  // received), in rank order, on the gradients' device, then divided.
  Tensor sum = std::move(parts[0]);  // [numel]
  for (int r = 1; r < n; ++r) {
    kernels::add_inplace(sum, parts[size_t(r)]);
    parts[size_t(r)] = Tensor();
  }
  b.flat = kernels::binary_scalar(BinaryOp::div, sum, float(n));
  held.sub(bytes * (n - 1));
}

// Waits for bucket b's reduction, resuming it on this thread.
void wait_for(DataParallel::Step& step, size_t b) { step.buckets[b].queue->drain(); }

// Starts bucket b's mean all-reduce. Every dp rank builds the same buckets
// and completes them in the same order (the same graph runs backward in the
// same order), so the k-th all_reduce call pairs with the k-th everywhere.
// From backward (`early`), a ZeRO-2 bucket then waits for the one launched
// kInFlight buckets before: its peers have sent it or are about to (they run
// the same backward), and the buffers it holds are freed now rather than
// after backward.
void launch(DataParallel::Step& step, size_t b, comm::Comm& dp, bool early) {
  ++step.launched;
  Bucket& bucket = step.buckets[b];
  bucket.queue = std::make_unique<sched::RunQueue>();
  sched::RunQueue*& current = sched::RunQueue::current();
  sched::RunQueue* const outer = std::exchange(current, bucket.queue.get());
  run_reduction(bucket.owner < 0 ? dp.all_reduce(bucket.flat, comm::ReduceOp::mean)
                                 : reduce_to_owner(bucket, dp, step.held),
                &step, &bucket);
  current = outer;
  if (!early || bucket.owner < 0) return;
  step.in_flight.push_back(b);
  while (step.in_flight.size() > kInFlight) {
    wait_for(step, step.in_flight.front());
    step.in_flight.pop_front();
  }
}

// The bucket's buffer, made (zeros: an unused parameter's gradient is 0) when first needed.
Tensor& buffer(DataParallel::Step& step, Bucket& b) {
  if (!b.flat.defined()) {
    b.flat = Tensor::zeros(Shape{b.numel}, DType::f32, b.device);
    step.held.add(b.numel * int64_t(sizeof(float)));
  }
  return b.flat;
}

// The rows of `g` an entry holds ({0, -1}: all of it).
Tensor rows_of(const Tensor& g, std::pair<int64_t, int64_t> rows) {
  return rows.second < 0 ? g : g.slice0(rows.first, rows.second);
}

// Copies a final gradient (each part) into its bucket; a bucket's last entry starts it.
void arrive(DataParallel::Step& step, const std::string& name, const Tensor& g, comm::Comm& dp) {
  for (const Slot& s : step.slots.at(name)) {
    Bucket& b = step.buckets[s.bucket];
    const Tensor part = rows_of(g.detach(), s.rows);
    buffer(step, b).slice0(s.offset, s.offset + part.numel()).copy_from(part);  // as f32
    if (++b.arrived == b.names.size()) launch(step, s.bucket, dp, true);
  }
}

}  // namespace

void DataParallel::begin(const ParamTree& params, const std::vector<std::string>& order) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, p] : params) shapes.emplace(name, p.shape());
  begin(shapes, params.empty() ? Device::cpu() : params.begin()->second.device(), order);
}

void DataParallel::start(const std::map<std::string, Shape>& shapes, Device device,
                         const std::vector<std::string>& order) {
  begin(shapes, device, order);
}

void DataParallel::hand_over(const std::string& name, const Tensor& grad) {
  REDCO_CHECK(step_, "DataParallel::hand_over: no step in flight (call start() first)");
  arrive(*step_, name, grad, *dp_);
}

void DataParallel::begin(const std::map<std::string, Shape>& shapes, Device device,
                         const std::vector<std::string>& order) {
  REDCO_CHECK(!step_, "DataParallel: finish() the previous step before starting another");
  REDCO_CHECK(order.size() == shapes.size(),
              "DataParallel: {} parameters but {} names in the order", shapes.size(), order.size());
  step_ = std::make_unique<Step>();
  // One bucket being filled per owner (just one without ZeRO-2); a bucket's
  // slots are numbered when it is closed, so buckets keep their closing order.
  std::map<int, Bucket> pending;
  std::map<int, int64_t> numel;
  auto close = [&](int owner) {
    Bucket& b = pending[owner];
    int64_t offset = 0;
    for (size_t i = 0; i < b.names.size(); ++i) {
      step_->slots[b.names[i]].push_back({step_->buckets.size(), offset, b.rows[i]});
      offset += b.shapes[i].numel();
    }
    b.numel = offset;
    b.owner = owner;
    b.device = device;
    step_->buckets.push_back(std::move(b));
    pending.erase(owner);
    numel.erase(owner);
  };
  // ZeRO-2: each owner's gradients leave in at least about four buckets, so
  // that most of another replica's buckets are freed during backward (one
  // bucket per owner would keep them all, and the owner's received parts too).
  size_t limit = bucket_bytes_;
  if (owners_) {
    int64_t total = 0;
    for (const auto& [name, shape] : shapes) total += shape.numel();
    const auto per_owner = size_t(total) * sizeof(float) / size_t(dp_->size());
    limit = std::min(limit, std::max<size_t>(per_owner / 4, 4096));
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    auto found = shapes.find(*it);
    REDCO_CHECK(found != shapes.end(), "DataParallel: no parameter '{}'", *it);
    // ZeRO-2: each part of a split gradient goes to its own owner's bucket.
    static const std::vector<int> kAllReduce{-1};
    const std::vector<int>& owners = owners_ ? owners_->part_owners(*it) : kAllReduce;
    const Shape& shape = found->second;
    for (int k = 0; k < int(owners.size()); ++k) {
      const int owner = owners[size_t(k)];
      std::pair<int64_t, int64_t> rows{0, -1};
      Shape part = shape;
      if (owners.size() > 1) {
        rows = ZeroPartition::part_rows(shape[0], k, int(owners.size()));
        part[0] = rows.second - rows.first;
      }
      pending[owner].names.push_back(*it);
      pending[owner].shapes.push_back(part);
      pending[owner].rows.push_back(rows);
      if (size_t(numel[owner] += part.numel()) * sizeof(float) >= limit) close(owner);
    }
  }
  while (!pending.empty()) close(pending.begin()->first);
}

ParamTree DataParallel::watch(const ParamTree& params, const std::vector<std::string>& order) {
  begin(params, order);
  Step* step = step_.get();
  comm::Comm* dp = dp_;
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
                              return {Tensor()};  // kept in the bucket only
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
    Tensor& flat = buffer(*step, bucket);
    int64_t at = 0;
    for (size_t i = 0; i < bucket.names.size(); ++i) {
      const int64_t n = bucket.shapes[i].numel();
      const auto it = grads.find(bucket.names[i]);
      if (it != grads.end() && it->second.defined())  // converted to f32
        flat.slice0(at, at + n).copy_from(rows_of(it->second, bucket.rows[i]));
      at += n;
    }
    bucket.arrived = bucket.names.size();
    launch(*step, b, *dp_, false);
  }
  {
    const profile::Scope scope("dp.finish_wait");  // what backward could not hide (--profile)
    for (size_t b = 0; b < step->buckets.size(); ++b) wait_for(*step, b);
  }
  last_peak_ = uint64_t(step->held.peak);
  if (step->error) std::rethrow_exception(step->error);
  for (const Bucket& b : step->buckets)
    if (b.owner >= 0 && b.owner != dp_->rank())  // ZeRO-2: another replica's gradients (or parts)
      for (const std::string& name : b.names) grads.erase(name);
  for (const Bucket& b : step->buckets) {
    if (b.owner >= 0 && b.owner != dp_->rank()) continue;
    // Views of the reduced buffer: no second copy of the gradients.
    int64_t offset = 0;
    for (size_t i = 0; i < b.names.size(); ++i) {
      const int64_t n = b.shapes[i].numel();
      grads[b.names[i]] = b.flat.slice0(offset, offset + n).view(b.shapes[i]);
      offset += n;
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
