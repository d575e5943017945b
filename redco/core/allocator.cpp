#include "redco/core/allocator.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"

namespace redco {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
// Requests above this size come from mmap'ed regions, 2 MiB aligned (huge
// pages); the top small size class is exactly 1 MiB.
constexpr size_t kLargeBlock = size_t(1) << 20;
// Large sizes are rounded to this granule, not to whole huge pages: GPT-2's
// 768x768 weights (2.25 MiB) would take 4 MiB each, and with their AdamW
// moments that rounding alone cost ~330 MB on GPT-2 124M. Huge pages are a
// property of the region, so blocks inside it need no coarser alignment.
constexpr size_t kLargeGranule = size_t(64) << 10;

constexpr size_t kLongLivedRegion = size_t(64) << 20;

bool is_large(size_t cap) { return cap > kLargeBlock; }

// Which pool this thread's large allocations come from (see LongLivedScope).
thread_local int t_pool = 0;

// Maps `size` bytes (a 2 MiB multiple) starting on a 2 MiB boundary: mmap only
// promises 4 KiB alignment, so it over-maps by 2 MiB and unmaps the unaligned
// head and tail. Only an aligned region can be backed by transparent huge pages
// from its first byte on.
char* map_region(size_t size) {
  const size_t over = size + kHugePage;
  void* m = mmap(nullptr, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* const raw = static_cast<char*>(m);
  const uintptr_t a = uintptr_t(raw);
  char* const base = raw + ((a + kHugePage - 1) / kHugePage * kHugePage - a);
  if (base > raw) munmap(raw, size_t(base - raw));
  if (raw + over > base + size) munmap(base + size, size_t(raw + over - (base + size)));
  madvise(base, size, MADV_HUGEPAGE);  // a hint: fewer, cheaper faults when THP is on
  return base;
}

}  // namespace

// Small blocks (up to 1 MiB) are cached in exact size-class free lists.
// Large blocks used to be cached the same way, keyed by their exact capacity,
// but then a block freed in forward (a 412 MB logits tensor, activations) was
// never reused by backward requests of other sizes, which mapped fresh memory:
// training GPT-2 124M (bench_gpt_train --config M) held ~800 MB beyond its
// peak in use (4756 MB for 3956 MB; 4263 MB for 3503 MB on a later tree). So
// large blocks are carved from mmap'ed regions instead, best fit with
// splitting and coalescing, as in PyTorch's CUDA caching allocator: a request
// takes the smallest free block that fits and leaves its tail free; a freed
// block merges with the free blocks next to it in the same region. The same
// run now holds 3672 MB for its 3503 MB peak. Regions are whole huge pages
// and start on a 2 MiB boundary; blocks are 64 KiB multiples inside them.
//
// Two pools of regions, so that state living for the whole run (parameters,
// optimizer moments) is not carved out of the holes that activations leave
// in the first step: AdamW's moments, created after the first backward, used
// to split the 25 MB holes of GPT-2's MLP activations, and the second step
// then mapped its activations afresh (358 MB held beyond the peak in use on
// config M). Blocks never move between pools.
struct CachingAllocator::Impl {
  struct Region {
    size_t size;  // as mapped
    int pool;
  };
  // The free large blocks of one pool twice: by address (-> size) to find the
  // neighbours of a freed block, and by (size, address) to find the best fit.
  struct Pool {
    std::map<char*, size_t> free_by_addr;
    std::set<std::pair<size_t, char*>> free_by_size;
  };
  mutable std::mutex mu;
  AllocatorStats stats;
  std::unordered_map<size_t, std::vector<void*>> small_free;  // capacity -> free blocks
  std::map<char*, Region> regions;                            // base -> region
  std::array<Pool, 2> pools;                                  // 0: everything else, 1: long-lived

  void add_free(Pool& pool, char* p, size_t size) {
    pool.free_by_addr.emplace(p, size);
    pool.free_by_size.emplace(size, p);
  }
  void remove_free(Pool& pool, std::map<char*, size_t>::iterator it) {
    pool.free_by_size.erase({it->second, it->first});
    pool.free_by_addr.erase(it);
  }

  // A cached block of `cap` bytes, or nullptr when none fits. Updates bytes_cached.
  void* take_cached(size_t cap) {
    if (!is_large(cap)) {
      auto it = small_free.find(cap);
      if (it == small_free.end() || it->second.empty()) return nullptr;
      void* p = it->second.back();
      it->second.pop_back();
      stats.bytes_cached -= cap;
      return p;
    }
    Pool& pool = pools[size_t(t_pool)];
    auto best = pool.free_by_size.lower_bound({cap, nullptr});
    if (best == pool.free_by_size.end()) return nullptr;
    auto [size, p] = *best;
    remove_free(pool, pool.free_by_addr.find(p));
    if (size > cap) add_free(pool, p + cap, size - cap);  // the tail stays free
    stats.bytes_cached -= cap;
    return p;
  }

  // Frees a large block, merging it with the free blocks on either side that
  // lie in the same region: never across regions, which are munmapped whole.
  void free_large(char* p, size_t cap) {
    auto r = regions.upper_bound(p);
    REDCO_CHECK(r != regions.begin(), "deallocate: {} is not a block of this allocator",
                static_cast<void*>(p));
    --r;
    char* const lo = r->first;
    char* const hi = lo + r->second.size;
    Pool& pool = pools[size_t(r->second.pool)];
    auto& free_by_addr = pool.free_by_addr;
    REDCO_CHECK(p + cap <= hi, "deallocate: {} bytes at {} overrun their region", cap,
                static_cast<void*>(p));
    auto next = free_by_addr.lower_bound(p);
    auto prev = next == free_by_addr.begin() ? free_by_addr.end() : std::prev(next);
    REDCO_CHECK((next == free_by_addr.end() || next->first >= p + cap) &&
                    (prev == free_by_addr.end() || prev->first + prev->second <= p),
                "deallocate: {} was freed twice", static_cast<void*>(p));
    char* start = p;
    size_t size = cap;
    if (next != free_by_addr.end() && next->first == p + cap && p + cap < hi) {
      size += next->second;
      remove_free(pool, next);
    }
    if (prev != free_by_addr.end() && p > lo && prev->first + prev->second == p) {
      start = prev->first;
      size += prev->second;
      remove_free(pool, prev);
    }
    add_free(pool, start, size);
    stats.bytes_cached += cap;
  }

  // Unmaps every region that is entirely free and frees the small free lists.
  // A region that still holds a live block is kept whole, free parts included:
  // simpler bookkeeping (regions never change after mmap), at the cost of
  // keeping those parts mapped.
  void release_cached() {
    for (auto& [cap, blocks] : small_free) {
      for (void* p : blocks) std::free(p);
      stats.bytes_cached -= cap * blocks.size();
    }
    small_free.clear();
    for (auto r = regions.begin(); r != regions.end();) {
      Pool& pool = pools[size_t(r->second.pool)];
      auto f = pool.free_by_addr.find(r->first);
      if (f == pool.free_by_addr.end() || f->second != r->second.size) {
        ++r;
        continue;
      }
      remove_free(pool, f);
      munmap(r->first, r->second.size);
      stats.bytes_cached -= r->second.size;
      r = regions.erase(r);
    }
  }
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

CachingAllocator& CachingAllocator::test_device() {
  static CachingAllocator* a = new CachingAllocator();  // leaked, as cpu()
  return *a;
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes <= 64) return 64;
  if (bytes > kLargeBlock) return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
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
  auto note_use = [&](AllocatorStats& s) {
    s.bytes_in_use += cap;
    s.peak_bytes_in_use = std::max(s.peak_bytes_in_use, s.bytes_in_use);
  };
  {
    std::lock_guard lock(impl_->mu);
    if (void* p = impl_->take_cached(cap)) {
      ++impl_->stats.cache_hits;
      note_use(impl_->stats);
      return p;
    }
  }
  // Nothing cached fits: ask the OS, outside the lock. A large request maps a
  // region of its size rounded up to whole huge pages; the block is its head
  // and the rest is free for others (regions of at least 32 or 128 MiB held
  // more on GPT-2).
  // Long-lived blocks are never freed, so they pack into shared regions: one
  // each would leave a partly used huge page per weight (on GPT-2, 1.8 MB of
  // every 768x768 weight and of each of its two moments). Pages of a region
  // that are never touched cost no memory.
  const size_t whole_pages = (cap + kHugePage - 1) / kHugePage * kHugePage;
  const size_t region = t_pool == 1 ? std::max(whole_pages, kLongLivedRegion) : whole_pages;
  auto system_alloc = [cap, region]() -> void* {
    return is_large(cap) ? map_region(region) : std::aligned_alloc(64, cap);
  };
  void* p = system_alloc();
  if (!p) {  // give the cache back to the OS and try once more before failing
    empty_cache();
    p = system_alloc();
  }
  REDCO_CHECK(p,
              "out of memory allocating {} bytes on cpu (in use: {} bytes); use a smaller "
              "batch size or more model shards",
              cap, stats().bytes_in_use);
  std::lock_guard lock(impl_->mu);
  ++impl_->stats.system_allocs;
  if (is_large(cap)) {
    impl_->regions.emplace(static_cast<char*>(p), Impl::Region{region, t_pool});
    if (region > cap) {
      impl_->add_free(impl_->pools[size_t(t_pool)], static_cast<char*>(p) + cap, region - cap);
      impl_->stats.bytes_cached += region - cap;
    }
  }
  note_use(impl_->stats);
  return p;
}

void CachingAllocator::deallocate(void* p, size_t capacity) {
  std::lock_guard lock(impl_->mu);
  if (is_large(capacity)) {
    impl_->free_large(static_cast<char*>(p), capacity);
  } else {
    impl_->small_free[capacity].push_back(p);
    impl_->stats.bytes_cached += capacity;
  }
  impl_->stats.bytes_in_use -= capacity;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(impl_->mu);
  impl_->stats.peak_bytes_in_use = impl_->stats.bytes_in_use;
}

CachingAllocator::LongLivedScope::LongLivedScope() : previous_(t_pool) { t_pool = 1; }
CachingAllocator::LongLivedScope::~LongLivedScope() { t_pool = previous_; }

void CachingAllocator::empty_cache() {
  std::lock_guard lock(impl_->mu);
  impl_->release_cached();
}

}  // namespace redco
