// Decode attention over a paged KV cache against rows of slots: one decode
// step's attention (one query row per request) for a batch of requests at a
// given depth, TinyLlama's heads (32 query heads over 4 kv heads of 64), bf16
// cache, as redco-serve runs it. The paged pool holds each request's blocks
// in a shuffled order, as a server's pool does after requests have come and
// gone. Both live in 2 MiB-aligned memory advised for huge pages, as the
// library's allocator places a cache (a 4 KiB page per block would make this
// a TLB benchmark). Contenders take turns, each keeping its best of N rounds.
//
//   bench_paged_decode [--rows 16] [--depths 512,2048] [--blocks 16,32,64] [--reps 20]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/ops/cpu/attention.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> list(const char* s) {
  std::vector<int64_t> out;
  std::string text(s);
  for (char* p = std::strtok(text.data(), ","); p; p = std::strtok(nullptr, ","))
    out.push_back(std::atoll(p));
  return out;
}

struct Options {
  int64_t rows = 16, reps = 20;
  std::vector<int64_t> depths{512, 2048}, blocks{16, 32, 64};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows")
      o.rows = std::atoll(argv[i + 1]);
    else if (a == "--reps")
      o.reps = std::atoll(argv[i + 1]);
    else if (a == "--depths")
      o.depths = list(argv[i + 1]);
    else if (a == "--blocks")
      o.blocks = list(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: bench_paged_decode [--rows N] [--depths ..] [--blocks ..] "
                   "[--reps N]\n");
      std::exit(2);
    }
  }
  return o;
}

// n bf16 elements in memory advised for huge pages (never freed: a benchmark).
uint16_t* huge(size_t n) {
  const size_t align = size_t(2) << 20, bytes = (n * 2 + align - 1) / align * align;
  auto* p = static_cast<uint16_t*>(std::aligned_alloc(align, bytes));
  madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

// One contender: its shape (paged or not), keys and values, and best time.
struct Contender {
  std::string name;
  redco::cpu::AttentionShape s;
  uint16_t *k = nullptr, *v = nullptr;
  std::vector<int64_t> table;
  double best = 1e30;
};

void bench_depth(const Options& o, int64_t depth) {
  const int64_t B = o.rows, Hq = 32, Hkv = 4, D = 64;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint16_t> bits(0x3c00, 0x3f80);  // bf16 in [~0.0078, 1)
  std::vector<int64_t> end(size_t(B), depth), offset(size_t(B), depth - 1), begin(size_t(B), 0);
  std::vector<Contender> cs;
  redco::cpu::AttentionShape rows{B, Hq, Hkv, 1, depth, D, 0.125f, true};
  rows.key_begin = begin.data(), rows.key_end = end.data(), rows.causal_offset = offset.data();
  cs.push_back({"rows", rows, nullptr, nullptr, {}});
  for (int64_t block : o.blocks) {
    const int64_t M = (depth + block - 1) / block;
    redco::cpu::AttentionShape p = rows;
    p.Tk = M * block, p.block = block, p.blocks_per_row = M;
    Contender c{"block " + std::to_string(block), p, nullptr, nullptr,
                std::vector<int64_t>(size_t(B * M))};
    for (int64_t i = 0; i < B * M; ++i) c.table[size_t(i)] = i;
    std::shuffle(c.table.begin(), c.table.end(), rng);
    cs.push_back(std::move(c));
  }
  for (auto& c : cs) {
    const size_t n =
        size_t(c.s.block ? B * c.s.blocks_per_row * Hkv * c.s.block * D : B * Hkv * depth * D);
    c.k = huge(n), c.v = huge(n);
    for (uint16_t* x : {c.k, c.v})
      for (size_t i = 0; i < n; ++i) x[i] = bits(rng);
    if (c.s.block) c.s.block_table = c.table.data();
  }
  std::vector<float> q(size_t(B * Hq * D), 0.1f), out(q.size()), lse(size_t(B * Hq));
  for (int64_t r = 0; r <= o.reps; ++r)  // round 0 warms up
    for (auto& c : cs) {
      const auto t0 = Clock::now();
      redco::cpu::decode_attention_forward(c.s, q.data(), c.k, c.v, true, out.data(), lse.data());
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r > 0) c.best = std::min(c.best, t);
    }
  for (const auto& c : cs)
    std::printf("%6ld %5ld  %-10s %9.1f us  %6.3fx rows  %6.1f GB/s\n", long(B), long(depth),
                c.name.c_str(), c.best * 1e6, c.best / cs[0].best,
                double(2 * B * Hkv * depth * D * 2) / c.best * 1e-9);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::printf("decode attention, bf16 cache, Hq 32 / Hkv 4 / D 64, best of %ld rounds\n",
              long(o.reps));
  std::printf("%6s %5s  %-10s %12s  %12s  %11s\n", "rows", "depth", "layout", "time", "ratio",
              "K+V read");
  for (int64_t depth : o.depths) bench_depth(o, depth);
  return 0;
}
