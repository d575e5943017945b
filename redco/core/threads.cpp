#include "redco/core/threads.hpp"

#include <tbb/global_control.h>

#include <memory>
#include <mutex>

#include "redco/core/error.hpp"

namespace redco {
namespace {

// The cap lives as long as this object (oneTBB's rule for global_control).
std::mutex cap_mutex;
std::unique_ptr<tbb::global_control> cap;

}  // namespace

void set_num_threads(int n) {
  REDCO_CHECK(n >= 0, "set_num_threads: needs a thread count >= 1 (or 0 for the default), got {}",
              n);
  std::lock_guard lock(cap_mutex);
  cap.reset();
  if (n > 0)
    cap = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                size_t(n));
}

int num_threads() {
  return int(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
}

}  // namespace redco
