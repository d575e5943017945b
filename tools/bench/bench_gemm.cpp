// GEMM throughput: redco::cpu::sgemm against the raw libraries it could sit on
// (oneDNN, OpenBLAS, Eigen), on the GEMMs of one GPT-2-small layer, at 1 and 2
// threads. Also measures the tiny-GEMM crossover and what each threading
// scheme costs when GEMMs share the machine with TBB work.
//
//   bench_gemm [--reps N] [--lm-rows M] [--only big|small|mix]
//
// Every contender of a row runs once to warm up, then the contenders take
// turns for N repetitions and each keeps its best time, so a burst of noise on
// a shared machine hits them alike instead of one of them.
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "redco/ops/cpu/gemm.hpp"

#if __has_include(<cblas.h>)
#include <cblas.h>
#endif
#ifdef OPENBLAS_VERSION
#define BENCH_HAVE_OPENBLAS 1
#else
#define BENCH_HAVE_OPENBLAS 0
#endif

namespace {

using Clock = std::chrono::steady_clock;

// oneDNN reads its thread count from the OpenMP ICV of the calling thread.
// libgomp is loaded as oneDNN's dependency but not linked to this binary, so
// its entry points are looked up at run time.
void omp_threads(int n) {
  static auto* set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set != nullptr) set(n);
}

void set_library_threads(int n) {
  omp_threads(n);
#if BENCH_HAVE_OPENBLAS
  openblas_set_num_threads(n);
#endif
  Eigen::setNbThreads(n);
}

// settle_ms: a pause after each run, for contenders whose idle threads keep
// spinning after a call (libgomp, OpenBLAS, TBB workers) and would otherwise
// steal the cores from whichever contender runs next.
struct Contender {
  std::string name;
  std::function<void()> run;
  int settle_ms = 0;
  double best = std::numeric_limits<double>::infinity();
};

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Warm-up round, then round-robin repetitions; fills Contender::best. With
// warm_each every timed run follows an untimed one, so short runs are not
// charged for the caches and clocks that the previous contender or a settle
// pause left cold.
void measure(std::vector<Contender>& cs, int reps, bool warm_each = false) {
  for (int r = -1; r < reps; ++r) {
    for (auto& c : cs) {
      if (warm_each && r >= 0) c.run();
      const double sec = seconds(c.run);
      if (r >= 0) c.best = std::min(c.best, sec);
      std::this_thread::sleep_for(std::chrono::milliseconds(c.settle_ms));
    }
  }
}

std::vector<float> random_vec(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

struct Shape {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
};

struct Operands {
  std::vector<float> A, B, C;
  int64_t lda, ldb, ldc;
};

Operands make_operands(const Shape& s) {
  Operands o;
  o.lda = s.ta ? s.M : s.K;
  o.ldb = s.tb ? s.K : s.N;
  o.ldc = s.N;
  o.A = random_vec(s.M * s.K, 1);
  o.B = random_vec(s.K * s.N, 2);
  o.C.assign(static_cast<size_t>(s.M * s.N), 0.f);
  return o;
}

void eigen_gemm(const Shape& s, Operands& o) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using CMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
  CMap a(o.A.data(), s.ta ? s.K : s.M, s.ta ? s.M : s.K, Eigen::OuterStride<>(o.lda));
  CMap b(o.B.data(), s.tb ? s.N : s.K, s.tb ? s.K : s.N, Eigen::OuterStride<>(o.ldb));
  Eigen::Map<RowMat, 0, Eigen::OuterStride<>> c(o.C.data(), s.M, s.N, Eigen::OuterStride<>(o.ldc));
  if (!s.ta && !s.tb) c.noalias() = a * b;
  if (s.ta && !s.tb) c.noalias() = a.transpose() * b;
  if (!s.ta && s.tb) c.noalias() = a * b.transpose();
  if (s.ta && s.tb) c.noalias() = a.transpose() * b.transpose();
}

void raw_dnnl(const Shape& s, Operands& o) {
  dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.f, o.A.data(), o.lda, o.B.data(),
             o.ldb, 0.f, o.C.data(), o.ldc);
}

std::vector<Contender> contenders(const Shape& s, Operands& o, tbb::task_arena& arena,
                                  int threads) {
  // OpenBLAS's idle threads spin for up to 2^28 cycles (~0.1 s) after a call
  const int settle = threads > 1 ? 200 : 0;
  std::vector<Contender> cs;
  cs.push_back({"redco",
                [&] {
                  arena.execute([&] {
                    redco::cpu::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, o.A.data(), o.lda, o.B.data(),
                                      o.ldb, 0.f, o.C.data(), o.ldc);
                  });
                },
                settle});
  cs.push_back({"oneDNN", [&] { raw_dnnl(s, o); }, settle});
#if BENCH_HAVE_OPENBLAS
  cs.push_back({"OpenBLAS",
                [&] {
                  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans,
                              s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1.f, o.A.data(),
                              o.lda, o.B.data(), o.ldb, 0.f, o.C.data(), o.ldc);
                },
                settle});
#endif
  // Eigen parallelises only through OpenMP, which this build does not enable;
  // its multi-threaded number would just repeat the single-threaded one.
  if (Eigen::nbThreads() >= threads) cs.push_back({"Eigen", [&] { eigen_gemm(s, o); }});
  return cs;
}

double find_best(const std::vector<Contender>& cs, const std::string& name) {
  for (const auto& c : cs)
    if (c.name == name) return c.best;
  return std::numeric_limits<double>::quiet_NaN();
}

void throughput_table(int64_t lm_rows, int reps) {
  // One GPT-2-small layer on 4096 tokens, weights stored [out, in].
  const Shape shapes[] = {
      {"MLP up fwd  X*W^T", false, true, 4096, 3072, 768},
      {"MLP up dX   dY*W", false, false, 4096, 768, 3072},
      {"MLP up dW   dY^T*X", true, false, 3072, 768, 4096},
      {"QKV fwd     X*W^T", false, true, 4096, 2304, 768},
      {"LM head fwd X*E^T", false, true, lm_rows, 50257, 768},
  };
  const char* libs[] = {"redco", "oneDNN", "OpenBLAS", "Eigen"};
  std::printf("| GEMM | M x N x K | thr | redco | oneDNN | OpenBLAS | Eigen | redco/best raw |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    Operands o = make_operands(s);
    const double gflop = 2.0 * s.M * s.N * s.K * 1e-9;
    for (int t : {1, 2}) {
      tbb::task_arena arena(t);
      set_library_threads(t);
      auto cs = contenders(s, o, arena, t);
      measure(cs, reps);
      std::printf("| %s | %ldx%ldx%ld | %d |", s.name, static_cast<long>(s.M),
                  static_cast<long>(s.N), static_cast<long>(s.K), t);
      double best_raw = std::numeric_limits<double>::infinity();
      for (const char* lib : libs) {
        const double sec = find_best(cs, lib);
        if (std::isnan(sec)) {
          std::printf(" - |");
          continue;
        }
        std::printf(" %.1f |", gflop / sec);
        if (std::strcmp(lib, "redco") != 0) best_raw = std::min(best_raw, sec);
      }
      std::printf(" %.2f |\n", best_raw / find_best(cs, "redco"));
      std::fflush(stdout);
    }
  }
}

// Microseconds per call for n x n x n products, 1 thread: where the inline
// loop beats oneDNN's dispatch, and where 2 threads start to pay off.
void small_table(int reps) {
  std::printf(
      "\n| n (n x n x n) | redco 1 thr (us) | oneDNN 1 thr (us) | redco 2 thr (us) | oneDNN 2 thr "
      "(us) |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int64_t n : {2, 4, 8, 12, 16, 32, 64, 96, 128, 192, 256, 384, 512}) {
    const Shape s{"", false, false, n, n, n};
    Operands o = make_operands(s);
    const int calls = static_cast<int>(std::clamp<int64_t>(20'000'000 / (n * n * n), 4, 20000));
    auto repeat = [calls](std::function<void()> f) {
      return [calls, f] {
        for (int i = 0; i < calls; ++i) f();
      };
    };
    auto redco_call = [&] {
      redco::cpu::sgemm(false, false, n, n, n, 1.f, o.A.data(), n, o.B.data(), n, 0.f, o.C.data(),
                        n);
    };
    tbb::task_arena one(1), two(2);
    set_library_threads(1);
    std::vector<Contender> cs = {
        {"redco1", repeat([&] { one.execute(redco_call); })},
        {"dnnl1", repeat([&] { raw_dnnl(s, o); })},
        {"redco2", repeat([&] { two.execute(redco_call); }), 30},
        {"dnnl2", repeat([&] {
           omp_threads(2);
           raw_dnnl(s, o);
           omp_threads(1);
         }),
         30},
    };
    measure(cs, reps, /*warm_each=*/true);
    std::printf("| %ld | %.3f | %.3f | %.3f | %.3f |\n", static_cast<long>(n),
                cs[0].best / calls * 1e6, cs[1].best / calls * 1e6, cs[2].best / calls * 1e6,
                cs[3].best / calls * 1e6);
  }
}

// GEMMs that share the machine with TBB work, 2 threads everywhere.
// "alternating": a TBB elementwise pass over the output after every GEMM (a
// layer's GEMM then its activation); "from TBB tasks": 2 TBB tasks each issue GEMMs (conv and
// attention call sgemm per image/head). Raw oneDNN runs with OpenMP at 2
// threads, as a monolithic scheme would leave it.
void composition_table(int reps) {
  const Shape s{"", false, true, 256, 768, 768};
  Operands o = make_operands(s);
  tbb::task_arena arena(2);
  set_library_threads(2);
  // the activation runs on the GEMM's own output, as in a layer
  auto activation = [&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, o.C.size()), [&](const auto& r) {
      for (size_t i = r.begin(); i < r.end(); ++i)
        o.C[i] = o.C[i] * 0.5f * (1.f + std::tanh(o.C[i]));
    });
  };
  auto redco_gemm = [&](float* c) {
    redco::cpu::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.f, c,
                      o.ldc);
  };
  auto dnnl_gemm = [&](float* c) {
    dnnl_sgemm('N', 'T', s.M, s.N, s.K, 1.f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.f, c, o.ldc);
  };
  std::vector<float> c2(o.C.size() * 2);
  auto alternating = [&](auto gemm) {
    return [&, gemm] {
      arena.execute([&] {
        for (int i = 0; i < 20; ++i) {
          gemm(o.C.data());
          activation();
        }
      });
    };
  };
  auto from_tasks = [&](auto gemm) {
    return [&, gemm] {
      arena.execute([&] {
        tbb::parallel_for(0, 2, [&](int j) {
          for (int i = 0; i < 20; ++i) gemm(c2.data() + j * o.C.size());
        });
      });
    };
  };
  std::vector<Contender> cs = {{"redco alt", alternating(redco_gemm), 200},
                               {"dnnl alt", alternating(dnnl_gemm), 200},
                               {"redco tasks", from_tasks(redco_gemm), 200},
                               {"dnnl tasks", from_tasks(dnnl_gemm), 200}};
  measure(cs, reps);
  std::printf("\n| 2 threads, 256x768x768 GEMMs | redco (ms) | oneDNN OpenMP (ms) |\n");
  std::printf("|---|---|---|\n");
  std::printf("| alternating with a TBB pass, 20x | %.1f | %.1f |\n", cs[0].best * 1e3,
              cs[1].best * 1e3);
  std::printf("| issued from 2 TBB tasks, 2x20 | %.1f | %.1f |\n", cs[2].best * 1e3,
              cs[3].best * 1e3);
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  int64_t lm_rows = 1024;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--lm-rows") == 0) lm_rows = std::max(1L, std::atol(argv[i + 1]));
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
  }
  const dnnl_version_t* v = dnnl_version();
  std::printf("bench_gemm: GFLOP/s, best of %d after a warm-up; %u hardware threads\n", reps,
              std::thread::hardware_concurrency());
  std::printf("oneDNN %d.%d.%d (cpu runtime %s), OpenBLAS %s, Eigen %d.%d.%d\n", v->major, v->minor,
              v->patch, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other",
              BENCH_HAVE_OPENBLAS ? "linked" : "not found", EIGEN_WORLD_VERSION,
              EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
  const char* corename = "-";
#if BENCH_HAVE_OPENBLAS
  corename = openblas_get_corename();  // the kernel set OPENBLAS_CORETYPE selected
#endif
  std::printf("OPENBLAS_CORETYPE=%s (OpenBLAS kernels: %s) OMP_NUM_THREADS=%s\n\n",
              env_or("OPENBLAS_CORETYPE", "(unset)"), corename,
              env_or("OMP_NUM_THREADS", "(unset)"));
  if (only.empty() || only == "big") throughput_table(lm_rows, reps);
  if (only.empty() || only == "small") small_table(reps);
  if (only.empty() || only == "mix") composition_table(reps);
  return 0;
}
