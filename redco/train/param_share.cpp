#include "redco/train/param_share.hpp"

#include <exception>
#include <utility>

#include "redco/comm/comm.hpp"
#include "redco/core/profile.hpp"
#include "redco/sched/background.hpp"

namespace redco::train {

struct ParamShare::InFlight {
  ZeroPartition::ShareBucket bucket;
  // What goes over the wire: the one part itself (in place), or the parts
  // packed in order ([their numel]), unpacked at a receiver once it arrives.
  Tensor message;
  bool packed = false, root = false, arrived = false;
  size_t broadcast = 0;  // its task in background_
};

ParamShare::ParamShare(std::vector<ZeroPartition::ShareBucket> buckets, comm::Comm& dp)
    : background_(std::make_unique<sched::Background>()) {
  const profile::Scope scope("zero.param_share");  // packing and starting
  for (ZeroPartition::ShareBucket& b : buckets) {
    auto f = std::make_unique<InFlight>();
    f->root = b.root == dp.rank();
    f->packed = b.parts.size() > 1;
    if (!f->packed) {
      f->message = b.parts.front();
    } else {
      int64_t numel = 0;
      for (const Tensor& t : b.parts) numel += t.numel();
      f->message = Tensor::empty(Shape{numel}, DType::f32, b.parts.front().device());
      int64_t at = 0;
      if (f->root)
        for (const Tensor& t : b.parts)
          f->message.slice0(at, at + t.numel()).copy_from(t), at += t.numel();
    }
    f->bucket = std::move(b);
    f->broadcast = background_->start(dp.broadcast(f->message, f->bucket.root));
    for (const std::string& n : f->bucket.names) carriers_[n].push_back(f.get());
    buckets_.push_back(std::move(f));
  }
  outer_ = std::exchange(nn::param_read_hook(), this);
  installed_ = true;
}

ParamShare::~ParamShare() {
  try {
    settle();
  } catch (...) {  // a failure the owner did not wait for: the job is stopping anyway
  }
}

void ParamShare::wait(InFlight& b) {
  if (b.arrived) return;
  b.arrived = true;
  // What of the broadcast the step could not hide (--profile).
  const profile::Scope scope("zero.param_wait");
  background_->wait(b.broadcast);
  if (b.packed && !b.root) {
    int64_t at = 0;
    for (Tensor& t : b.bucket.parts)
      t.copy_from(b.message.slice0(at, at + t.numel())), at += t.numel();
  }
  b.message = Tensor();  // the packed buffer goes back to the allocator now
}

void ParamShare::before_read(std::string_view name) {
  const auto it = carriers_.find(name);
  if (it == carriers_.end()) return;
  const std::vector<InFlight*> carriers = std::move(it->second);
  carriers_.erase(it);
  for (InFlight* b : carriers) wait(*b);
  if (carriers_.empty()) settle();  // every parameter has arrived
}

void ParamShare::settle() {
  std::exception_ptr first;
  for (auto& b : buckets_) try {
      wait(*b);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  carriers_.clear();
  if (installed_ && nn::param_read_hook() == this) nn::param_read_hook() = outer_;
  installed_ = false;
  if (first) std::rethrow_exception(first);
}

}  // namespace redco::train
