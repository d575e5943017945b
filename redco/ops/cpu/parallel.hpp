#pragma once
// How the CPU kernels split work over oneTBB. Tiny inputs stay serial on the
// calling thread: below a grain of work, scheduling a task costs more than
// the work itself.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <vector>

namespace redco::cpu {

// Calls f(begin, end) over [0, n): once, serially, when n <= grain; else on
// TBB chunks of about `grain` items.
template <typename F>
void parallel_chunks(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  if (n <= grain) {
    f(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.end()); });
}

// Items per task so that a task does about `target` units of work when one
// item costs `per_item` units.
inline int64_t grain_for(int64_t target, int64_t per_item) {
  return std::max<int64_t>(1, target / std::max<int64_t>(per_item, 1));
}

// Scratch for kernels that reduce with Eigen. Eigen's vectorised reductions
// peel to an aligned address first, so their summation order — and the last
// bit of the result — depends on where a buffer starts; malloc's 16-byte
// alignment would make results vary from call to call. Scratch aligned like
// every tensor (64 bytes) keeps kernels bitwise reproducible.
using AlignedFloats = std::vector<float, Eigen::aligned_allocator<float>>;

}  // namespace redco::cpu
