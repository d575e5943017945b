// Tensor basics: dtype conversions, views and copies, error messages, Philox
// reproducibility, and the caching allocator: its steady state, and best fit
// with splitting and coalescing of large blocks.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "redco/core/allocator.hpp"
#include "redco/core/philox.hpp"
#include "redco/core/tensor.hpp"
#include "redco/core/threads.hpp"

namespace redco {
namespace {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// x converted to `t` and back to f32.
std::vector<float> round_trip(const std::vector<float>& x, DType t) {
  return Tensor::from<float>(x, {int64_t(x.size())}).to(t).to(DType::f32).to_vector();
}

TEST_CASE("bf16 round trip is exact on representable values", "[tensor][dtype]") {
  const std::vector<float> exact = {0.f,
                                    -0.f,
                                    1.f,
                                    -2.5f,
                                    0.15625f,
                                    1.0078125f,              // 1 + 2^-7
                                    from_bits(0x7f7f0000u),  // the largest finite bf16
                                    from_bits(0x00010000u),  // a subnormal
                                    std::numeric_limits<float>::infinity()};
  std::vector<float> want;
  for (float v : exact) want.push_back(bf16_to_float(float_to_bf16(v)));
  CHECK(want == exact);  // the values above are all representable
  CHECK(round_trip(exact, DType::bf16) == exact);
}

TEST_CASE("bf16 rounds to nearest, ties to even", "[tensor][dtype]") {
  const float ulp = std::ldexp(1.f, -7);  // spacing of bf16 in [1, 2)
  const std::vector<float> in = {
      1.f + ulp / 2,             // tie, 1.0 has the even mantissa -> 1
      1.f + 3 * ulp / 2,         // tie between 1+ulp and 1+2ulp -> 1+2ulp (even)
      1.f + ulp / 2 + ulp / 64,  // just above the tie -> up
      1.f + ulp / 2 - ulp / 64,  // just below -> down
      -(1.f + 3 * ulp / 2)};     // sign-symmetric
  const std::vector<float> want = {1.f, 1.f + 2 * ulp, 1.f + ulp, 1.f, -(1.f + 2 * ulp)};
  CHECK(round_trip(in, DType::bf16) == want);
  CHECK(std::isnan(round_trip({std::nanf("")}, DType::bf16)[0]));
}

TEST_CASE("f32 to bf16 and back over a large tensor match converting each element alone",
          "[tensor][dtype]") {
  // Tensor::to(bf16) has a vectorised, parallel loop of its own (mixed
  // precision's GEMM operands); every bit pattern class must come out as the
  // scalar rule says: round to nearest even, NaN made quiet, overflow to inf.
  auto reference = [](uint32_t u) -> uint16_t {
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  };
  const size_t n = 300'000;  // several parallel chunks of 65536
  std::vector<float> x(n);
  uint32_t state = 12345;
  const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00000u, 0x7f7fffffu,
                              0x00008000u, 0x00018000u, 0x3f808000u, 0x3f818000u, 0x80000000u};
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;  // every bit pattern is fair game
    x[i] = from_bits(i % 97 < 10 ? special[i % 97] : state);
  }
  const Tensor h = Tensor::from<float>(x, {int64_t(n)}).to(DType::bf16);
  const auto* got = static_cast<const uint16_t*>(h.raw());
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    wrong += got[i] != reference(u);
  }
  CHECK(wrong == 0);
  // ... and widening back (its own typed loop) is exact: the bf16 bits on top.
  const Tensor back = h.to(DType::f32);
  const auto* wide = static_cast<const uint32_t*>(back.raw());
  size_t wrong_back = 0;
  for (size_t i = 0; i < n; ++i) wrong_back += wide[i] != uint32_t(got[i]) << 16;
  CHECK(wrong_back == 0);
}

TEST_CASE("f16 round trip: exact values, ties to even, subnormals, overflow", "[tensor][dtype]") {
  const float min_sub = std::ldexp(1.f, -24), min_norm = std::ldexp(1.f, -14);
  const std::vector<float> exact = {0.f,      1.f,     -2.5f,       65504.f,
                                    min_norm, min_sub, 3 * min_sub, 0.099975586f /* 0x2E66 */};
  CHECK(round_trip(exact, DType::f16) == exact);

  const float ulp = std::ldexp(1.f, -10);  // spacing of f16 in [1, 2)
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {1.f + ulp / 2,      // tie -> 1 (even)
                                 1.f + 3 * ulp / 2,  // tie -> 1 + 2ulp (even)
                                 min_sub / 2,        // tie between 0 and min_sub -> 0 (even)
                                 3 * min_sub / 4,    // above the tie -> min_sub
                                 3 * min_sub / 2,    // tie between 1 and 2 min_sub -> 2 min_sub
                                 65519.f,            // below the overflow threshold -> 65504
                                 65520.f,            // the threshold rounds up to inf
                                 -1e6f};
  const std::vector<float> want = {1.f,         1.f + 2 * ulp, 0.f, min_sub,
                                   2 * min_sub, 65504.f,       inf, -inf};
  CHECK(round_trip(in, DType::f16) == want);
  CHECK(std::isnan(round_trip({from_bits(0x7fc00001u)}, DType::f16)[0]));
}

TEST_CASE("integer dtypes convert through float", "[tensor][dtype]") {
  const Tensor i = Tensor::from<int64_t>(std::vector<int64_t>{-3, 0, 7, 1 << 20}, {4});
  CHECK(i.to(DType::f32).to_vector() == std::vector<float>{-3, 0, 7, 1 << 20});
  CHECK(i.to(DType::i32).values<int32_t>() == std::vector<int32_t>{-3, 0, 7, 1 << 20});
  const Tensor f = Tensor::from({0.f, 1.f, 200.f, 255.f}, {4});
  CHECK(f.to(DType::u8).values<uint8_t>() == std::vector<uint8_t>{0, 1, 200, 255});
  CHECK(Tensor::arange(5, DType::i32).values<int32_t>() == std::vector<int32_t>{0, 1, 2, 3, 4});
}

TEST_CASE("views along leading dims share storage; clone does not", "[tensor][views]") {
  Tensor x = Tensor::arange(12).view({4, 3});
  Tensor rows = x.slice0(1, 3);
  CHECK(rows.shape() == Shape{2, 3});
  CHECK(rows.shares_storage_with(x));
  CHECK(rows.to_vector() == std::vector<float>{3, 4, 5, 6, 7, 8});
  rows.fill(-1.f);  // writes through to x
  CHECK(x.to_vector() == std::vector<float>{0, 1, 2, -1, -1, -1, -1, -1, -1, 9, 10, 11});

  Tensor last = x[3];
  CHECK(last.shape() == Shape{3});
  last.data<float>()[0] = 42.f;
  CHECK(x.data<float>()[9] == 42.f);

  Tensor flat = x.view({-1});
  CHECK(flat.shape() == Shape{12});
  CHECK(flat.shares_storage_with(x));
  CHECK(x.view({2, -1}).shape() == Shape{2, 6});

  Tensor copy = x.clone();
  CHECK_FALSE(copy.shares_storage_with(x));
  copy.fill(0.f);
  CHECK(x.data<float>()[0] == 0.f);
  CHECK(x.data<float>()[1] == 1.f);
  CHECK(x.to(DType::f32).same(x));  // same dtype: no copy
}

TEST_CASE("shape errors name the shapes involved", "[tensor][errors]") {
  const Tensor x = Tensor::zeros({2, 3});
  std::string msg = error_of([&] { x.view({4}); });
  CHECK_THAT(msg, Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
  msg = error_of([&] { x.view({-1, 4}); });
  CHECK_THAT(msg, Catch::Contains("[2, 3]"));
  msg = error_of([&] { check_same_shape(x, Tensor::zeros({3, 2}), "my_op"); });
  CHECK_THAT(msg,
             Catch::Contains("my_op") && Catch::Contains("[2, 3]") && Catch::Contains("[3, 2]"));
  msg = error_of([&] { Tensor::zeros({2, 2}).copy_from(x); });
  CHECK_THAT(msg, Catch::Contains("[2, 3]") && Catch::Contains("[2, 2]"));
  msg = error_of([&] { x.slice0(1, 3); });
  CHECK_THAT(msg, Catch::Contains("[2, 3]"));
  msg = error_of([&] { x.data<int32_t>(); });
  CHECK_THAT(msg, Catch::Contains("f32") && Catch::Contains("i32"));
  msg = error_of([&] { Tensor::empty({-1, 3}); });
  CHECK_THAT(msg, Catch::Contains("[-1, 3]"));
  msg = error_of([&] { Tensor::from({1.f, 2.f}, {3}); });
  CHECK_THAT(msg, Catch::Contains("[3]"));
}

TEST_CASE("Philox draws are reproducible and index-pure", "[tensor][random]") {
  const Tensor a = Tensor::uniform({1000}, 123, 5, -2.f, 3.f);
  const Tensor b = Tensor::uniform({1000}, 123, 5, -2.f, 3.f);
  CHECK(a.to_vector() == b.to_vector());
  CHECK(a.to_vector() != Tensor::uniform({1000}, 123, 6, -2.f, 3.f).to_vector());
  CHECK(a.to_vector() != Tensor::uniform({1000}, 124, 5, -2.f, 3.f).to_vector());
  for (float v : a.to_vector()) {
    CHECK(v >= -2.f);
    CHECK(v < 3.f);
  }
  // The shape does not matter, only the flat index.
  CHECK(Tensor::uniform({10, 100}, 123, 5, -2.f, 3.f).to_vector() == a.to_vector());

  // A shard owning flat range [offset, offset + n) draws exactly those values
  // (offsets not a multiple of 4 start mid Philox block).
  for (int64_t offset : {0, 3, 250, 517}) {
    const int64_t n = 101;
    std::vector<float> shard(static_cast<size_t>(n));
    philox_uniform(shard.data(), n, 123, 5, offset, -2.f, 3.f);
    CHECK(shard == a.slice0(offset, offset + n).to_vector());
  }

  const Tensor big = Tensor::normal({4000}, 9, 1, 0.5f, 2.f);
  CHECK(big.to_vector() == Tensor::normal({4000}, 9, 1, 0.5f, 2.f).to_vector());
  std::vector<float> part(100);
  philox_normal(part.data(), 100, 9, 1, 1001, 0.5f, 2.f);
  CHECK(part == big.slice0(1001, 1101).to_vector());
  double mean = 0, sq = 0;
  for (float v : big.to_vector()) mean += v, sq += double(v) * v;
  mean /= 4000;
  const double sd = std::sqrt(sq / 4000 - mean * mean);
  CHECK(mean == Approx(0.5).margin(0.15));  // 4 standard errors
  CHECK(sd == Approx(2.0).margin(0.12));
}

// One "training step": activations of several sizes (some >= 1 MiB, served
// by mmap) are allocated, some are freed early, some live to the end.
void fake_step() {
  std::vector<Tensor> keep;
  for (int layer = 0; layer < 3; ++layer) {
    Tensor act = Tensor::empty({512, 1024});     // 2 MiB
    Tensor tmp = Tensor::zeros({300, 1000});     // ~1.2 MiB
    Tensor small = Tensor::full({17, 33}, 1.f);  // small size class
    Tensor ids = Tensor::empty({64}, DType::i64);
    act.fill(float(layer));
    keep.push_back(act);
    keep.push_back(small.clone());
    (void)tmp;
    (void)ids;
  }
  keep.clear();
}

TEST_CASE("caching allocator: a repeated step allocates nothing new", "[tensor][allocator]") {
  auto& alloc = CachingAllocator::cpu();
  fake_step();  // warm-up fills the cache
  const AllocatorStats before = alloc.stats();
  for (int i = 0; i < 3; ++i) fake_step();
  const AllocatorStats after = alloc.stats();
  CHECK(after.system_allocs == before.system_allocs);
  CHECK(after.cache_hits > before.cache_hits);
  CHECK(after.bytes_in_use == before.bytes_in_use);

  for (size_t bytes :
       {size_t(1), size_t(64), size_t(65), size_t(1000), size_t(1) << 20, (size_t(3) << 20) + 1}) {
    const size_t cap = CachingAllocator::round_size(bytes);
    CHECK(cap >= bytes);
    if (bytes > (size_t(1) << 20))  // large: 64 KiB granules, not whole huge pages
      CHECK((cap % (size_t(64) << 10) == 0 && cap - bytes < (size_t(64) << 10)));
    else  // <= 25% waste, and every class is whole 64-byte lines (aligned_alloc's rule)
      CHECK((cap % 64 == 0 && cap <= std::max<size_t>((bytes + 63) / 64 * 64, bytes + bytes / 4)));
  }
}

// ---- large blocks: best fit, splitting, coalescing -----------------------------------
// These use CachingAllocator::cpu() directly on raw blocks. It is process-wide
// and other tests leave blocks in its cache, so they check deltas of its stats
// and free whatever they allocate.

constexpr size_t kMiB = size_t(1) << 20;

struct Block {
  void* p = nullptr;
  size_t cap = 0;
  char* at() const { return static_cast<char*>(p); }
  uintptr_t addr() const { return uintptr_t(p); }  // what CHECK prints (not a char* string)
};

Block grab(size_t bytes) {
  Block b;
  b.p = CachingAllocator::cpu().allocate(bytes, &b.cap);
  return b;
}

void drop(Block& b) {
  CachingAllocator::cpu().deallocate(b.p, b.cap);
  b = {};
}

// Empties the cache and returns a size (a multiple of parts * 2 MiB) whose
// 1/parts is larger than all the free memory still held: a block of this
// size comes from a fresh region, and its parts fit nowhere else.
size_t fresh_region_size(size_t parts) {
  auto& alloc = CachingAllocator::cpu();
  alloc.empty_cache();
  const size_t unit = parts * 2 * kMiB;
  const size_t want = std::max(32 * kMiB, parts * (alloc.stats().bytes_cached + 2 * kMiB));
  return (want + unit - 1) / unit * unit;
}

TEST_CASE("caching allocator: a freed large block serves requests of other sizes",
          "[tensor][allocator]") {
  auto& alloc = CachingAllocator::cpu();
  Block big = grab(64 * kMiB);
  drop(big);
  const AllocatorStats before = alloc.stats();
  std::vector<Block> blocks = {grab(8 * kMiB), grab(16 * kMiB), grab(20 * kMiB)};
  const AllocatorStats after = alloc.stats();
  CHECK(after.system_allocs == before.system_allocs);  // carved from the 64 MiB block
  CHECK(after.cache_hits == before.cache_hits + 3);
  CHECK(after.bytes_in_use == before.bytes_in_use + 44 * kMiB);
  for (size_t i = 0; i < blocks.size(); ++i) std::memset(blocks[i].p, int(i + 1), blocks[i].cap);
  for (size_t i = 0; i < blocks.size(); ++i) {  // no block overwrote another
    CHECK(blocks[i].at()[0] == char(i + 1));
    CHECK(blocks[i].at()[blocks[i].cap - 1] == char(i + 1));
  }
  std::sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.p < b.p; });
  for (size_t i = 0; i + 1 < blocks.size(); ++i)
    CHECK(blocks[i].addr() + blocks[i].cap <= blocks[i + 1].addr());
  for (Block& b : blocks) drop(b);
  CHECK(alloc.stats().bytes_in_use == before.bytes_in_use);
}

TEST_CASE("caching allocator: long-lived blocks keep out of the holes others leave",
          "[tensor][allocator]") {
  auto& alloc = CachingAllocator::cpu();
  const size_t size = fresh_region_size(1);
  Block hole = grab(size);  // then freed: a hole an activation left
  const uintptr_t base = hole.addr();
  drop(hole);
  const AllocatorStats before = alloc.stats();
  Block a, b;
  {
    CachingAllocator::LongLivedScope long_lived;  // e.g. optimizer moments
    a = grab(3 * kMiB);
    b = grab(3 * kMiB);
  }
  for (const Block* blk : {&a, &b})
    CHECK((blk->addr() + blk->cap <= base || blk->addr() >= base + size));
  // Both in one region for long-lived blocks, side by side.
  CHECK(alloc.stats().system_allocs == before.system_allocs + 1);
  CHECK(b.addr() == a.addr() + a.cap);
  Block again = grab(size);  // the hole is still whole
  CHECK(again.addr() == base);
  drop(again);
  drop(a);
  drop(b);
  CHECK(alloc.stats().bytes_in_use == before.bytes_in_use);
}

TEST_CASE("caching allocator: freed neighbours coalesce into one block", "[tensor][allocator]") {
  auto& alloc = CachingAllocator::cpu();
  const size_t size = fresh_region_size(4);
  const AllocatorStats start = alloc.stats();
  Block region = grab(size);
  CHECK(alloc.stats().system_allocs == start.system_allocs + 1);
  const uintptr_t base = region.addr();
  drop(region);
  // Split the free region into a quarter, a quarter and a half, head first.
  Block a = grab(size / 4), b = grab(size / 4), c = grab(size / 2);
  CHECK(a.addr() == base);
  CHECK(b.addr() == base + size / 4);
  CHECK(c.addr() == base + size / 2);
  drop(a);
  drop(c);
  drop(b);  // merges with the free blocks before and after it
  Block whole = grab(size);
  CHECK(whole.addr() == base);
  const AllocatorStats after = alloc.stats();
  CHECK(after.system_allocs == start.system_allocs + 1);
  CHECK(after.cache_hits == start.cache_hits + 4);
  drop(whole);
}

// One training-like step on raw blocks: forward keeps an activation per layer
// and frees a temporary, the loss allocates logits and their gradient, and
// backward allocates gradients of other sizes while it frees the activations.
void fake_train_step() {
  std::vector<Block> acts;
  for (size_t l = 0; l < 4; ++l) {
    acts.push_back(grab((6 + 2 * l) * kMiB));
    Block tmp = grab(24 * kMiB + 1);  // 26 MiB
    drop(tmp);
  }
  Block logits = grab(40 * kMiB);
  Block dlogits = grab(40 * kMiB);
  drop(logits);
  Block grad = grab(12 * kMiB);
  drop(dlogits);
  for (size_t l = 4; l-- > 0;) {
    Block g = grab((10 + 4 * l) * kMiB);
    drop(acts[l]);
    drop(grad);
    grad = g;
  }
  drop(grad);
}

TEST_CASE("caching allocator: training steps reuse memory across sizes", "[tensor][allocator]") {
  auto& alloc = CachingAllocator::cpu();
  alloc.empty_cache();
  alloc.reset_peak();
  const AllocatorStats start = alloc.stats();
  fake_train_step();  // two warm-up steps fill the cache
  fake_train_step();
  const AllocatorStats warm = alloc.stats();
  for (int i = 0; i < 3; ++i) fake_train_step();
  const AllocatorStats after = alloc.stats();
  CHECK(after.system_allocs == warm.system_allocs);
  CHECK(after.bytes_in_use == start.bytes_in_use);
  const size_t held = after.bytes_in_use + after.bytes_cached;
  CHECK(held == warm.bytes_in_use + warm.bytes_cached);
  // What the steps made the allocator hold, against their peak in use (116
  // MiB): exact-size free lists held 208 MiB (1.8x), best fit holds 164 MiB
  // (1.4x: the 40 MiB logits cannot use the 26 MiB regions mapped before).
  const size_t peak = after.peak_bytes_in_use - start.bytes_in_use;
  const size_t grown = held - (start.bytes_in_use + start.bytes_cached);
  CHECK(peak == 116 * kMiB);
  CHECK(grown <= peak + peak / 2);
}

TEST_CASE("caching allocator: empty_cache unmaps regions with no block in use",
          "[tensor][allocator]") {
  auto& alloc = CachingAllocator::cpu();
  const size_t size = fresh_region_size(2);
  const AllocatorStats start = alloc.stats();
  Block region = grab(size);
  drop(region);
  Block half = grab(size / 2);  // the region is partly in use: it stays mapped
  alloc.empty_cache();
  CHECK(alloc.stats().bytes_cached == start.bytes_cached + size / 2);
  std::memset(half.p, 7, half.cap);
  drop(half);
  CHECK(alloc.stats().bytes_cached == start.bytes_cached + size);
  alloc.empty_cache();  // now entirely free: unmapped
  CHECK(alloc.stats().bytes_cached == start.bytes_cached);
  Block again = grab(size);  // so this needs the OS again
  CHECK(alloc.stats().system_allocs == start.system_allocs + 2);
  drop(again);
  alloc.empty_cache();
  CHECK(alloc.stats().bytes_cached == start.bytes_cached);
}

TEST_CASE("caching allocator: blocks are 64-byte aligned, fresh regions on 2 MiB",
          "[tensor][allocator]") {
  auto& alloc = CachingAllocator::cpu();
  const size_t size = fresh_region_size(1);
  const AllocatorStats start = alloc.stats();
  Block fresh = grab(size);
  CHECK(alloc.stats().system_allocs == start.system_allocs + 1);
  CHECK(fresh.addr() % (2 * kMiB) == 0);  // a fresh region starts on a huge page
  drop(fresh);
  std::vector<Block> blocks;
  for (size_t bytes : {size_t(1), size_t(100), size_t(5000), kMiB - 1, kMiB, kMiB + 1, 3 * kMiB + 7,
                       10 * kMiB, 37 * kMiB + 5})
    blocks.push_back(grab(bytes));
  for (const Block& b : blocks) {
    CHECK(b.addr() % 64 == 0);
    if (b.cap > kMiB) CHECK(b.addr() % (64 << 10) == 0);  // large: 64 KiB granules
  }
  for (Block& b : blocks) drop(b);
}

}  // namespace
// The threads a parallel loop ran on, each iteration long enough (1 ms) that
// oneTBB would hand some to a second thread wherever it has one.
static size_t threads_used() {
  std::mutex mu;
  std::set<std::thread::id> ids;
  tbb::parallel_for(0, 64, [&](int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  return ids.size();
}

TEST_CASE("set_num_threads caps every parallel loop, 0 lifts the cap", "[tensor][threads]") {
  const int before = num_threads();
  REQUIRE(before >= 1);
  set_num_threads(1);
  CHECK(num_threads() == 1);
  CHECK(threads_used() == 1);
  // A threaded conversion (parallel loops over 2^16-element blocks) gives the
  // same bits capped as it does with every thread.
  const Tensor x = Tensor::uniform({1000, 300}, 7, 0, -3.f, 3.f);
  auto bf16_bits = [&] {
    const Tensor h = x.to(DType::bf16);
    const auto* p = static_cast<const uint16_t*>(h.raw());
    return std::vector<uint16_t>(p, p + h.numel());
  };
  const std::vector<uint16_t> capped = bf16_bits();
  set_num_threads(0);
  CHECK(bf16_bits() == capped);
  CHECK(num_threads() == before);
  CHECK_THROWS_WITH(set_num_threads(-2), Catch::Contains(">= 1"));
  CHECK(num_threads() == before);
}

}  // namespace redco
