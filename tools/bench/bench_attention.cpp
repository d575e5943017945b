// Fused attention (redco::cpu::flash_attention_forward/backward) against the
// unfused composition an autograd graph would run, forward + backward, on one
// GPT-2-small attention layer (B=1, 12 heads x 64 dims, causal) at several
// sequence lengths. Both paths use the same redco::cpu::sgemm underneath.
//
//   bench_attention [--reps N] [--threads N] [--seqs 256,1024,2048] [--no-tiles]
//
// Unfused: S = scale Q K^T (sgemm_batched), causal mask (-inf), P = softmax(S),
// O = P V; backward dP = dO V^T (written over S), dS = softmax backward (in
// place), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO. It keeps S and P
// [B,H,T,T] alive from forward to backward, as saved activations would be.
//
// Memory is reported two ways: "counted" is the bytes of the buffers each path
// allocates beyond the shared inputs/outputs (q, k, v, o, dO, dq, dk, dv); for
// the fused path that is lse [B,H,T] plus what the kernel allocates inside:
// Delta [B,H,T] and one tile scratch per thread (see attention.cpp).
// "RSS" is the measured rise of the process's peak resident set while one
// fresh forward + backward runs: the peak is reset through /proc/self/clear_refs
// and read back with getrusage(ru_maxrss). Large allocations are forced onto
// mmap so freed buffers leave the resident set and the next reading is clean.
//
// Every contender runs once to warm up, then the two take turns for N
// repetitions and each keeps its best time, so noise on a shared machine hits
// both alike.
#include <malloc.h>
#include <sys/resource.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "redco/ops/cpu/attention.hpp"
#include "redco/ops/cpu/gemm.hpp"
#include "redco/ops/cpu/softmax.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using redco::cpu::AttentionShape;

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ------------------------------------------------------ tile product timing --

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using CMap = Eigen::Map<const RowMat>;
using Map = Eigen::Map<RowMat>;

// Best seconds per call of f over 5 rounds of `calls` calls.
double per_call(int calls, const std::function<void()>& f) {
  f();
  double best = std::numeric_limits<double>::infinity();
  for (int round = 0; round < 5; ++round)
    best = std::min(best, seconds([&] {
                            for (int i = 0; i < calls; ++i) f();
                          }) / calls);
  return best;
}

// The three 64x64x64 products of the kernel's inner loop, on one thread:
// NT (S = Q K^T), NN (O += P V), TN (dV += P^T dO).
void bench_tiles() {
  const int64_t n = 64;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.f);  // [64, 64] each
  const double flop = 2.0 * n * n * n;
  std::printf("## 64x64x64 tile products, one thread (us per call, GFLOP/s)\n");
  std::printf("%-24s %10s %8s %10s %8s\n", "product", "sgemm us", "GF/s", "Eigen us", "GF/s");
  struct Case {
    const char* name;
    bool ta, tb;
    float beta;
  };
  for (const Case& k :
       {Case{"NT  S = Q K^T", false, true, 0.f}, Case{"NN  O += P V", false, false, 1.f},
        Case{"TN  dV += P^T dO", true, false, 1.f}}) {
    const double t_gemm = per_call(4000, [&] {
      redco::cpu::sgemm(k.ta, k.tb, n, n, n, 1.f, a.data(), n, b.data(), n, k.beta, c.data(), n);
    });
    const CMap A(a.data(), n, n), B(b.data(), n, n);
    Map C(c.data(), n, n);
    const double t_eigen = per_call(4000, [&] {
      if (k.tb)
        C.noalias() = A * B.transpose();
      else if (k.ta)
        C.noalias() += A.transpose() * B;
      else
        C.noalias() += A * B;
    });
    std::printf("%-24s %10.2f %8.1f %10.2f %8.1f\n", k.name, t_gemm * 1e6, flop / t_gemm * 1e-9,
                t_eigen * 1e6, flop / t_eigen * 1e-9);
  }
  std::printf("\n");
}

// ------------------------------------------------------------ the two paths --

// Shared inputs and outputs, [B, H, T, D] each.
struct Buffers {
  std::vector<float> q, k, v, dout, o, dq, dk, dv;
  explicit Buffers(int64_t n) {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (auto* x : {&q, &k, &v, &dout}) {
      x->resize(static_cast<size_t>(n));
      for (auto& e : *x) e = dist(rng);
    }
    for (auto* x : {&o, &dq, &dk, &dv}) x->assign(static_cast<size_t>(n), 0.f);
  }
};

// Uninitialised floats: a zero fill would add a full pass over T x T buffers.
std::unique_ptr<float[]> floats(int64_t n) { return std::unique_ptr<float[]>(new float[n]); }

struct Fused {
  std::unique_ptr<float[]> lse;  // [B, H, T] saved by forward for backward
  explicit Fused(const AttentionShape& s) : lse(floats(s.B * s.Hq * s.Tq)) {}
  void run(const AttentionShape& s, Buffers& x) {
    redco::cpu::flash_attention_forward(s, x.q.data(), x.k.data(), x.v.data(), x.o.data(),
                                        lse.get());
    redco::cpu::flash_attention_backward(s, x.q.data(), x.k.data(), x.v.data(), x.o.data(),
                                         lse.get(), x.dout.data(), x.dq.data(), x.dk.data(),
                                         x.dv.data());
  }
  // lse, plus what the kernel allocates: Delta [B,H,T] and per thread one
  // forward tile scratch (64x64 scores, 64xD accumulator, 2x64 row stats) and
  // one backward scratch (two 64x64 tiles). No dq partial copies: with
  // B*Hkv = 12 >= 2 x threads every kv head is one task.
  static double counted_bytes(const AttentionShape& s, int threads) {
    const int64_t rows = s.B * s.Hq * s.Tq;
    const int64_t per_thread = (64 * 64 + 64 * s.D + 2 * 64) + 2 * 64 * 64;
    return 4.0 * (2 * rows + threads * per_thread);
  }
};

struct Unfused {
  std::unique_ptr<float[]> S;  // [B, H, T, T] scores; in backward dP, then dS
  std::unique_ptr<float[]> P;  // [B, H, T, T] probabilities, saved for backward
  explicit Unfused(const AttentionShape& s)
      : S(floats(s.B * s.Hq * s.Tq * s.Tk)), P(floats(s.B * s.Hq * s.Tq * s.Tk)) {}
  static double counted_bytes(const AttentionShape& s) {
    return 4.0 * 2 * s.B * s.Hq * s.Tq * s.Tk;
  }

  void forward(const AttentionShape& s, Buffers& x) {
    const int64_t BH = s.B * s.Hq, T = s.Tq, D = s.D, TD = T * D, TT = T * T;
    redco::cpu::sgemm_batched(BH, false, true, T, T, D, s.scale, x.q.data(), D, TD, x.k.data(), D,
                              TD, 0.f, S.get(), T, TT);
    float* sp = S.get();
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, BH * T, 64), [&](const auto& r) {
      for (int64_t row = r.begin(); row < r.end(); ++row) {
        const int64_t i = row % T;  // query i sees keys 0..i
        std::fill(sp + row * T + i + 1, sp + (row + 1) * T,
                  -std::numeric_limits<float>::infinity());
      }
    });
    redco::cpu::softmax_forward(S.get(), P.get(), BH * T, T);
    redco::cpu::sgemm_batched(BH, false, false, T, D, T, 1.f, P.get(), T, TT, x.v.data(), D, TD,
                              0.f, x.o.data(), D, TD);
  }
  void backward(const AttentionShape& s, Buffers& x) {
    const int64_t BH = s.B * s.Hq, T = s.Tq, D = s.D, TD = T * D, TT = T * T;
    redco::cpu::sgemm_batched(BH, false, true, T, T, D, 1.f, x.dout.data(), D, TD, x.v.data(), D,
                              TD, 0.f, S.get(), T, TT);
    redco::cpu::softmax_backward(P.get(), S.get(), S.get(), BH * T, T);
    redco::cpu::sgemm_batched(BH, false, false, T, D, T, s.scale, S.get(), T, TT, x.k.data(), D, TD,
                              0.f, x.dq.data(), D, TD);
    redco::cpu::sgemm_batched(BH, true, false, T, D, T, s.scale, S.get(), T, TT, x.q.data(), D, TD,
                              0.f, x.dk.data(), D, TD);
    redco::cpu::sgemm_batched(BH, true, false, T, D, T, 1.f, P.get(), T, TT, x.dout.data(), D, TD,
                              0.f, x.dv.data(), D, TD);
  }
  void run(const AttentionShape& s, Buffers& x) {
    forward(s, x);
    backward(s, x);
  }
};

// ---------------------------------------------------------------- memory ----

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Resets the peak-RSS mark to the current RSS (Linux >= 4.0); false if refused.
bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// Rise of peak RSS (MiB) while f runs, or NaN where the peak cannot be reset.
double peak_rss_rise_mib(const std::function<void()>& f) {
  if (!reset_peak_rss()) return std::nan("");
  const long before = max_rss_kib();
  f();
  return (max_rss_kib() - before) / 1024.0;
}

// ----------------------------------------------------------------- driver ---

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double{std::abs(a[i] - b[i])});
  return m;
}

// Buffers over this go to mmap and back to the OS on free (a fixed threshold
// also stops glibc from raising it after the first big free).
constexpr int kMmapThreshold = 64 << 10;

struct Options {
  int reps = 5;
  int threads = 2;
  bool tiles = true;
  std::vector<int64_t> seqs = {256, 1024, 2048};
};

// Times both paths at one length, checks they agree, measures memory; prints a row.
void bench_seq(const Options& opt, int64_t T) {
  const int64_t H = 12, D = 64;
  const AttentionShape s{1, H, H, T, T, D, 1.f / std::sqrt(static_cast<float>(D)), true};
  Buffers fx(s.B * H * T * D), ux = fx;
  Fused fused(s);
  double t_f = std::numeric_limits<double>::infinity(), t_u = t_f;
  {
    Unfused unfused(s);
    fused.run(s, fx);
    unfused.run(s, ux);
    const int reps = T <= 256 ? 4 * opt.reps : opt.reps;
    for (int r = 0; r < reps; ++r) {
      t_f = std::min(t_f, seconds([&] { fused.run(s, fx); }));
      t_u = std::min(t_u, seconds([&] { unfused.run(s, ux); }));
    }
  }
  double diff = 0;
  for (auto m : {&Buffers::o, &Buffers::dq, &Buffers::dk, &Buffers::dv})
    diff = std::max(diff, max_abs_diff(fx.*m, ux.*m));
  // Fresh workspaces, fused first: each path's peak above the shared buffers.
  // During the measurement every allocation of 4 KiB or more is mmapped, so
  // the fused path's small buffers show up too instead of reusing heap pages
  // that earlier runs left resident.
  mallopt(M_MMAP_THRESHOLD, 4 << 10);
  const double rss_f = peak_rss_rise_mib([&] { Fused(s).run(s, fx); });
  const double rss_u = peak_rss_rise_mib([&] { Unfused(s).run(s, ux); });
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  const double mem_f = Fused::counted_bytes(s, opt.threads) / (1 << 20);
  const double mem_u = Unfused::counted_bytes(s) / (1 << 20);
  std::printf("%6ld %10.2f %10.2f %7.2fx %10.2f %10.1f %7.0fx %9.2f %9.1f %9.1e\n",
              static_cast<long>(T), t_f * 1e3, t_u * 1e3, t_u / t_f, mem_f, mem_u, mem_u / mem_f,
              rss_f, rss_u, diff);
  std::fflush(stdout);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      o.threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--seqs" && i + 1 < argc) {
      o.seqs.clear();
      for (char* p = std::strtok(argv[++i], ","); p != nullptr; p = std::strtok(nullptr, ","))
        o.seqs.push_back(std::max<int64_t>(1, std::atoll(p)));
    } else if (a == "--no-tiles") {
      o.tiles = false;
    } else {
      std::fprintf(stderr,
                   "usage: bench_attention [--reps N] [--threads N] [--seqs 256,1024,2048] "
                   "[--no-tiles]\n");
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, opt.threads);
  std::printf("threads=%d reps=%d (best of; 4x reps at T<=256)\n\n", opt.threads, opt.reps);
  if (opt.tiles) bench_tiles();
  std::printf("## causal attention forward+backward, B=1 H=12 D=64\n");
  std::printf("%6s %10s %10s %8s %10s %10s %8s %9s %9s %9s\n", "T", "fused ms", "unfus ms",
              "speedup", "fused MiB", "unfus MiB", "mem x", "fusedRSS", "unfusRSS", "max|diff|");
  for (const int64_t T : opt.seqs) bench_seq(opt, T);
  return 0;
}
