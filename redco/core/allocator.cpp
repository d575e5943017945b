#include "redco/core/allocator.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "redco/core/error.hpp"

namespace redco {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
// Blocks at least this large come from mmap, 2 MiB aligned, as huge pages.
constexpr size_t kLargeBlock = size_t(1) << 20;

void* system_alloc(size_t capacity) {
  if (capacity >= kLargeBlock) {
    void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    madvise(p, capacity, MADV_HUGEPAGE);  // a hint: fewer, cheaper faults when THP is on
    return p;
  }
  return std::aligned_alloc(64, capacity);
}

void system_free(void* p, size_t capacity) {
  if (capacity >= kLargeBlock)
    munmap(p, capacity);
  else
    std::free(p);
}

}  // namespace

struct CachingAllocator::Impl {
  mutable std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_lists;  // capacity -> free blocks
  AllocatorStats stats;
};

CachingAllocator::CachingAllocator() : impl_(new Impl) {}
CachingAllocator::~CachingAllocator() {
  empty_cache();
  delete impl_;
}

CachingAllocator& CachingAllocator::cpu() {
  // Leaked on purpose: tensors in static objects may be freed after main().
  static CachingAllocator* a = new CachingAllocator();
  return *a;
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes <= 64) return 64;
  if (bytes >= kLargeBlock) return (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Below 1 MiB: four classes per power of two, so at most 25% is wasted;
  // every class is a multiple of the 64-byte alignment aligned_alloc needs.
  size_t pow2 = 64;
  while (pow2 * 2 < bytes) pow2 *= 2;
  const size_t step = std::max<size_t>(pow2 / 4, 64);
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t bytes, size_t* capacity) {
  const size_t cap = round_size(bytes);
  *capacity = cap;
  {
    std::lock_guard lock(impl_->mu);
    auto& s = impl_->stats;
    auto it = impl_->free_lists.find(cap);
    if (it != impl_->free_lists.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      s.bytes_cached -= cap;
      s.bytes_in_use += cap;
      s.peak_bytes_in_use = std::max(s.peak_bytes_in_use, s.bytes_in_use);
      ++s.cache_hits;
      return p;
    }
  }
  void* p = system_alloc(cap);
  if (!p) {  // give the cache back to the OS and try once more before failing
    empty_cache();
    p = system_alloc(cap);
  }
  REDCO_CHECK(p,
              "out of memory allocating {} bytes on cpu (in use: {} bytes); use a smaller "
              "batch size or more model shards",
              cap, stats().bytes_in_use);
  std::lock_guard lock(impl_->mu);
  auto& s = impl_->stats;
  ++s.system_allocs;
  s.bytes_in_use += cap;
  s.peak_bytes_in_use = std::max(s.peak_bytes_in_use, s.bytes_in_use);
  return p;
}

void CachingAllocator::deallocate(void* p, size_t capacity) {
  std::lock_guard lock(impl_->mu);
  impl_->free_lists[capacity].push_back(p);
  impl_->stats.bytes_in_use -= capacity;
  impl_->stats.bytes_cached += capacity;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(impl_->mu);
  impl_->stats.peak_bytes_in_use = impl_->stats.bytes_in_use;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(impl_->mu);
  for (auto& [cap, blocks] : impl_->free_lists)
    for (void* p : blocks) system_free(p, cap);
  impl_->free_lists.clear();
  impl_->stats.bytes_cached = 0;
}

}  // namespace redco
