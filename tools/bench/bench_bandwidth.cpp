// Read bandwidth of main memory, measured: the rate at which 1 thread and
// every thread at once can stream a buffer far larger than the caches, as a
// decode step streams the weights. bench_generate.py quotes decode's achieved
// weight bandwidth (weight bytes x steps / decode time) against this number;
// decode at batch 1 is memory-bound, so this is its ceiling.
//
//   bench_bandwidth [--mib M] [--seconds S]
//
// The last line is machine-readable:
//   bandwidth threads=T mib=M read_1=G read_all=G wall_1=G wall_all=G   (GB/s, 1e9 B/s)
// read_* divide by the threads' CPU time (the memory's rate while we run),
// wall_* by elapsed time (what a loaded machine leaves us).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Sums a float range with 8 independent vector accumulators: enough loads in
// flight that the core is limited by memory, not by add latency. The sum is
// returned so that the compiler cannot drop the reads.
float read_range(const float* p, size_t n) {
#if defined(__AVX2__)
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_loadu_ps(p + i + 8 * k));
  for (int k = 1; k < 8; ++k) acc[0] = _mm256_add_ps(acc[0], acc[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float s = 0;
  for (float x : lanes) s += x;
#else
  float s = 0;
  size_t i = 0;
#endif
  for (; i < n; ++i) s += p[i];
  return s;
}

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Rate {
  double wall = 0;  // bytes / elapsed time of the pass
  double cpu = 0;   // bytes / the slowest thread's CPU time: the rate while on a core
};

// Best rates (GB/s) over passes of `threads` threads each reading its own
// contiguous slice of the buffer. On a shared, loaded machine a pass is often
// descheduled: the wall rate then measures our share of the CPUs, and the
// CPU-time rate what the memory delivers while we run.
Rate measure(const std::vector<float>& buf, int threads, double seconds) {
  const size_t n = buf.size(), slice = n / static_cast<size_t>(threads);
  std::vector<float> sums(static_cast<size_t>(threads));
  std::vector<double> cpu(static_cast<size_t>(threads));
  Rate best;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (int pass = 0; pass < 3 || Clock::now() < end; ++pass) {
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const double c0 = thread_seconds();
        sums[size_t(t)] = read_range(buf.data() + size_t(t) * slice, slice);
        cpu[size_t(t)] = thread_seconds() - c0;
      });
    for (auto& th : pool) th.join();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double bytes = double(slice * size_t(threads) * sizeof(float));
    best.wall = std::max(best.wall, bytes / wall / 1e9);
    best.cpu = std::max(best.cpu, bytes / *std::max_element(cpu.begin(), cpu.end()) / 1e9);
  }
  if (sums[0] == 12345.f) std::puts("");  // keeps the sums observable
  return best;
}

long flag(int argc, char** argv, const char* name, long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) {
      char* end = nullptr;
      const long v = std::strtol(argv[i + 1], &end, 10);
      if (*end != '\0' || v <= 0) {
        std::fprintf(stderr, "bench_bandwidth: %s wants a positive integer, got '%s'\n", name,
                     argv[i + 1]);
        std::exit(2);
      }
      return v;
    }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i += 2)
    if (std::strcmp(argv[i], "--mib") != 0 && std::strcmp(argv[i], "--seconds") != 0) {
      std::fprintf(stderr, "bench_bandwidth: unknown flag '%s' (use --mib M, --seconds S)\n",
                   argv[i]);
      return 2;
    }
  const long mib = flag(argc, argv, "--mib", 1024), seconds = flag(argc, argv, "--seconds", 2);
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  // Filled with ones, so every page is mapped before timing starts.
  std::vector<float> buf(size_t(mib) * 1024 * 1024 / sizeof(float), 1.0f);
  const Rate one = measure(buf, 1, double(seconds));
  const Rate all = measure(buf, threads, double(seconds));
  std::printf("read %ld MiB: 1 thread %.1f GB/s (wall %.1f), %d threads %.1f GB/s (wall %.1f)\n",
              mib, one.cpu, one.wall, threads, all.cpu, all.wall);
  std::printf("bandwidth threads=%d mib=%ld read_1=%.1f read_all=%.1f wall_1=%.1f wall_all=%.1f\n",
              threads, mib, one.cpu, all.cpu, one.wall, all.wall);
  return 0;
}
