#pragma once
// Caching allocator: page faults are very expensive on the VMs redco targets
// (a framework that allocates fresh activations every step spends a large part
// of the step in the kernel), so freed blocks are kept and handed out again:
// small ones in size-class free lists, large ones (> 1 MiB, 64 KiB granules)
// as pieces of mmap'ed regions that are split and coalesced (best fit), so
// memory freed in forward serves backward requests of other sizes. Regions are
// 2 MiB aligned and advised as transparent huge pages. After the first training
// step or two, a step allocates nothing new from the OS:
// `stats().system_allocs` stops growing.
#include <cstddef>
#include <cstdint>

namespace redco {

struct AllocatorStats {
  size_t bytes_in_use = 0;       // handed out and not yet returned (rounded sizes)
  size_t peak_bytes_in_use = 0;  // high-water mark of bytes_in_use
  size_t bytes_cached = 0;       // free bytes kept for reuse (free blocks, free parts of regions)
  size_t system_allocs = 0;      // small blocks and large regions obtained from the OS so far
  size_t cache_hits = 0;         // requests served without the OS
};

class CachingAllocator {
 public:
  static CachingAllocator& cpu();  // the process-wide CPU allocator
  // The test device's own pool (DeviceKind::test): host memory kept apart from
  // the CPU's, so its statistics are the device's alone.
  static CachingAllocator& test_device();

  // Returns a 64-byte aligned block of at least `bytes`; *capacity receives
  // the rounded size, which must be passed back to deallocate.
  void* allocate(size_t bytes, size_t* capacity);
  void deallocate(void* p, size_t capacity);
  AllocatorStats stats() const;
  void reset_peak();
  // Returns cached memory to the OS (e.g. between phases of a program): every
  // small free block and every large region with no block in use; a region
  // that still holds a live block stays mapped whole.
  void empty_cache();
  // Rounding used for size classes (exposed for tests).
  static size_t round_size(size_t bytes);

  // While one is alive, this thread's large blocks come from regions kept for
  // state that lives as long as the run (parameters, optimizer moments), so
  // that it does not fragment the memory that each step's activations reuse.
  class LongLivedScope {
   public:
    LongLivedScope();
    ~LongLivedScope();
    LongLivedScope(const LongLivedScope&) = delete;
    LongLivedScope& operator=(const LongLivedScope&) = delete;

   private:
    int previous_;
  };

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  ~CachingAllocator();

 private:
  CachingAllocator();
  struct Impl;
  Impl* impl_;
};

}  // namespace redco
