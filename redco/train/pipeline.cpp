#include "redco/train/pipeline.hpp"

#include <tbb/task_group.h>

namespace redco::train::detail {

struct BackgroundTask::Impl {
  tbb::task_group group;
};

BackgroundTask::BackgroundTask() : impl_(new Impl) {}

BackgroundTask::~BackgroundTask() {
  try {
    impl_->group.wait();
  } catch (...) {  // the step's exception is the one in flight; a collate error is secondary
  }
  delete impl_;
}

void BackgroundTask::run(void (*fn)(void*), void* arg) {
  impl_->group.run([fn, arg] { fn(arg); });
}

void BackgroundTask::wait() { impl_->group.wait(); }

}  // namespace redco::train::detail
