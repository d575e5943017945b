// Peak arithmetic rate of this CPU, measured: fp32 FMAs (and bf16 dot products
// where the CPU has them) on registers only, on 1 thread and on every thread at
// once. MFU in tools/bench/gpt_bench is quoted against this number, because
// the clock in /proc/cpuinfo is the nominal one: a VM's cores often run
// faster (turbo) and the nominal figure would put GEMMs above 100%.
//
//   bench_peak [--seconds S]
//
// The last line is machine-readable:
//   peak threads=T f32_1=G f32_all=G bf16_1=G bf16_all=G   (GFLOP/s; bf16 0 if absent)
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Independent accumulators: FMA latency (4-5 cycles) x FMA pipes (2) needs at
// least 10 chains in flight to keep both pipes busy every cycle.
constexpr int kChains = 12;
constexpr long kInner = 1 << 14;

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
#else
#error "bench_peak needs AVX2+FMA or AVX-512 (build with -march=native)"
#endif

// The lanes added by hand (GCC 12's _mm512_reduce_add_ps trips
// -Wuninitialized); only the loop's result has to be kept alive.
template <typename V>
float sum(V v) {
  float t[sizeof(V) / sizeof(float)];
  std::memcpy(t, &v, sizeof v);
  float s = 0;
  for (float x : t) s += x;
  return s;
}

// Runs `rounds` x kInner x kChains FMAs; returns the FLOPs done. The result is
// consumed through `sink` so the compiler keeps the loop.
double f32_work(long rounds, std::atomic<float>& sink) {
  Vec acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = splat(1.0f + 1e-3f * c);
  const Vec a = splat(0.999999f), b = splat(1e-7f);
  for (long r = 0; r < rounds * kInner; ++r)
    for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], a, b);
  float s = 0;
  for (int c = 0; c < kChains; ++c) s += sum(acc[c]);
  sink.store(s, std::memory_order_relaxed);
  return 2.0 * kLanes * kChains * double(rounds) * kInner;
}

#if defined(__AVX512BF16__)
constexpr bool kHaveBf16 = true;
// vdpbf16ps: per fp32 lane, two bf16 products added to the accumulator
// (4 FLOPs per lane, 64 per instruction).
double bf16_work(long rounds, std::atomic<float>& sink) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 1e-3f * c);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-7f), _mm512_set1_ps(1e-7f));
  for (long r = 0; r < rounds * kInner; ++r)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  float s = 0;
  for (int c = 0; c < kChains; ++c) s += sum(acc[c]);
  sink.store(s, std::memory_order_relaxed);
  return 4.0 * 16 * kChains * double(rounds) * kInner;
}
#else
constexpr bool kHaveBf16 = false;
double bf16_work(long, std::atomic<float>&) { return 0; }
#endif

using Work = double (*)(long, std::atomic<float>&);

// GFLOP/s of `work` on `threads` threads started together, each for about
// `seconds`; the best of three tries (a shared VM steals time now and then).
double rate(Work work, int threads, double seconds) {
  std::atomic<float> sink{0};
  long rounds = 1;  // calibrate on one thread: rounds for ~`seconds`
  for (;;) {
    const auto t0 = Clock::now();
    work(rounds, sink);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt > 0.05) {
      rounds = std::max(1L, long(rounds * seconds / dt));
      break;
    }
    rounds *= 4;
  }
  double best = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<double> flops(threads);
    std::vector<std::thread> pool;
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { flops[t] = work(rounds, sink); });
    for (auto& th : pool) th.join();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / dt / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_peak [--seconds S]  (unknown argument '%s')\n", argv[i]);
      return 2;
    }
  }
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const double f1 = rate(f32_work, 1, seconds), fa = rate(f32_work, threads, seconds);
  const double b1 = kHaveBf16 ? rate(bf16_work, 1, seconds) : 0;
  const double ba = kHaveBf16 ? rate(bf16_work, threads, seconds) : 0;
  std::printf("fp32 FMA (%d-bit vectors): %.1f GFLOP/s on 1 thread, %.1f on %d\n", kLanes * 32, f1,
              fa, threads);
  if (kHaveBf16)
    std::printf("bf16 dot products (vdpbf16ps): %.1f GFLOP/s on 1 thread, %.1f on %d\n", b1, ba,
                threads);
  else
    std::printf("bf16 dot products: not available on this build/CPU\n");
  std::printf("peak threads=%d f32_1=%.1f f32_all=%.1f bf16_1=%.1f bf16_all=%.1f\n", threads, f1,
              fa, b1, ba);
  return 0;
}
