// Single-precision GEMM on oneDNN, parallelised by oneTBB.
//
// Threading. Debian's oneDNN runs its kernels on OpenMP (libgomp), while the
// rest of redco runs on oneTBB. Letting both pools loose on the same cores
// oversubscribes them: a GEMM called from inside a TBB task (conv, attention)
// would open one OpenMP team per calling worker, and after every OpenMP region
// libgomp's threads keep spinning for a while, stealing the cores TBB is about
// to use. So oneDNN is only ever called single-threaded (the calling thread's
// OpenMP thread count is pinned to 1 around the call), and redco splits the
// output into tiles that TBB schedules. The tile count follows the current
// arena's max_concurrency(), so a user limiting TBB limits GEMM too, and
// nested calls compose with the caller's parallel loops.
//
// Measured (tools/bench/README.md, 2 threads): on the transformer-sized GEMMs
// the TBB tiles run as fast as oneDNN's own OpenMP path (0.95-1.07x on a quiet
// Xeon, within the noise on the shared 2-core dev box), so the composable
// scheme costs nothing there. OpenMP's spinning team does start up faster:
// between ~100^3 and 128^3 it is ~25% quicker, a range redco keeps on one
// thread (see kMinTileMacs). Each tile is one single-threaded call, so for a
// given thread count the result does not depend on scheduling.
//
// Tiny products (a few hundred multiply-adds) cost more in oneDNN's dispatch
// (~0.3-0.4 us) than in a plain loop, so they take an inline kernel.
#include "redco/ops/cpu/gemm.hpp"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/best_of_three.hpp"

namespace redco::cpu {
namespace {

// At or below this many multiply-adds the inline loop beats oneDNN's call
// overhead (crossover measured at 8x8x8, and for skinny shapes near 512 too).
constexpr int64_t kTinyMacs = 512;

// A TBB tile should carry at least this many multiply-adds (~25-50 us of one
// core): below that, handing a tile to a TBB worker costs about what the split
// saves (2 threads, quiet Xeon: 128^3 as 2 tiles took 24-31 us against 26 us
// on one thread; 192^3 took 53-67 us against 83 us).
constexpr int64_t kMinTileMacs = int64_t{1} << 21;

// Tile edges are rounded to this many rows/columns: the micro-kernels work on
// 8- and 16-wide panels, and 16 floats keep column tiles cache-line aligned.
constexpr int64_t kTileAlign = 16;

struct Problem {
  bool ta, tb;
  int64_t M, N, K;
  float alpha;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float beta;
  float* C;
  int64_t ldc;
};

// oneDNN takes its thread count from the caller's OpenMP ICV. The OpenMP
// entry points are looked up at run time rather than linked: libgomp comes in
// as oneDNN's own dependency, and a oneDNN built on another runtime (TBB,
// sequential) has none, in which case there is nothing to pin.
class OmpPin {
 public:
  OmpPin() {
    static const Api api = load();
    api_ = &api;
    if (api_->set == nullptr) return;
    saved_ = api_->get();
    if (saved_ != 1) api_->set(1);
  }
  ~OmpPin() {
    if (api_->set != nullptr && saved_ != 1) api_->set(saved_);
  }
  OmpPin(const OmpPin&) = delete;
  OmpPin& operator=(const OmpPin&) = delete;

 private:
  struct Api {
    void (*set)(int) = nullptr;
    int (*get)() = nullptr;
  };
  static Api load() {
    Api a;
    a.set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    a.get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    if (a.set == nullptr || a.get == nullptr) a = Api{};
    return a;
  }
  const Api* api_ = nullptr;
  int saved_ = 1;
};

// C = beta * C, where beta == 0 overwrites (C may hold NaN).
void scale_c(const Problem& p) {
  for (int64_t i = 0; i < p.M; ++i) {
    float* c = p.C + i * p.ldc;
    if (p.beta == 0.f)
      std::fill(c, c + p.N, 0.f);
    else if (p.beta != 1.f)
      for (int64_t j = 0; j < p.N; ++j) c[j] *= p.beta;
  }
}

// Plain loops for tiny products. Without trans_b the inner loop is an axpy
// over a contiguous row of B; with trans_b it is a dot product over K.
void tiny_gemm(const Problem& p) {
  scale_c(p);
  const int64_t a_row = p.ta ? 1 : p.lda, a_col = p.ta ? p.lda : 1;
  for (int64_t i = 0; i < p.M; ++i) {
    const float* a = p.A + i * a_row;
    float* c = p.C + i * p.ldc;
    if (!p.tb) {
      for (int64_t k = 0; k < p.K; ++k) {
        const float s = p.alpha * a[k * a_col];
        const float* b = p.B + k * p.ldb;
        for (int64_t j = 0; j < p.N; ++j) c[j] += s * b[j];
      }
    } else {
      for (int64_t j = 0; j < p.N; ++j) {
        const float* b = p.B + j * p.ldb;
        float s = 0.f;
        for (int64_t k = 0; k < p.K; ++k) s += a[k * a_col] * b[k];
        c[j] += p.alpha * s;
      }
    }
  }
}

// One product on the calling thread only.
void serial_gemm(const Problem& p) {
  if (p.M == 0 || p.N == 0) return;
  if (p.K == 0 || p.alpha == 0.f) return scale_c(p);  // BLAS: A and B are not read
  if (p.M * p.N * p.K <= kTinyMacs) return tiny_gemm(p);
  OmpPin pin;
  const dnnl_status_t st = dnnl_sgemm(p.ta ? 'T' : 'N', p.tb ? 'T' : 'N', p.M, p.N, p.K, p.alpha,
                                      p.A, p.lda, p.B, p.ldb, p.beta, p.C, p.ldc);
  REDCO_CHECK(st == dnnl_success, "sgemm: oneDNN dnnl_sgemm failed (status {}) for M={} N={} K={}",
              static_cast<int>(st), p.M, p.N, p.K);
}

// How the output of one product is cut: tm row tiles times tn column tiles.
struct Grid {
  int64_t tm = 1, tn = 1;
  int64_t tiles() const { return tm * tn; }
};

// Uses at most `budget` tiles, each at least kMinTileMacs and kTileAlign wide;
// among the grids with the most tiles, the one with the squarest tiles wins,
// because each tile packs its own rows of op(A) and columns of op(B).
Grid choose_grid(int64_t M, int64_t N, int64_t K, int64_t budget) {
  const int64_t macs = M * N * K;
  budget = std::clamp<int64_t>(std::min(budget, macs / kMinTileMacs), 1, budget);
  const int64_t max_tm = std::max<int64_t>(1, M / kTileAlign);
  const int64_t max_tn = std::max<int64_t>(1, N / kTileAlign);
  Grid best;
  double best_edge = static_cast<double>(M + N);
  for (int64_t tm = 1; tm <= std::min(budget, max_tm); ++tm) {
    const int64_t tn = std::min(budget / tm, max_tn);
    const double edge = static_cast<double>(M) / tm + static_cast<double>(N) / tn;
    if (tm * tn > best.tiles() || (tm * tn == best.tiles() && edge < best_edge)) {
      best = Grid{tm, tn};
      best_edge = edge;
    }
  }
  return best;
}

// Boundary i of `parts` near-equal pieces of [0, n), rounded to kTileAlign.
int64_t cut(int64_t n, int64_t parts, int64_t i) {
  if (i >= parts) return n;
  const int64_t x = n * i / parts;
  return std::min(n, (x + kTileAlign / 2) / kTileAlign * kTileAlign);
}

// The sub-product that writes rows [m0, m1) and columns [n0, n1) of C.
Problem tile(const Problem& p, const Grid& g, int64_t index) {
  const int64_t im = index / g.tn, in = index % g.tn;
  const int64_t m0 = cut(p.M, g.tm, im), m1 = cut(p.M, g.tm, im + 1);
  const int64_t n0 = cut(p.N, g.tn, in), n1 = cut(p.N, g.tn, in + 1);
  Problem t = p;
  t.M = m1 - m0;
  t.N = n1 - n0;
  t.A = p.A + (p.ta ? m0 : m0 * p.lda);
  t.B = p.B + (p.tb ? n0 * p.ldb : n0);
  t.C = p.C + m0 * p.ldc + n0;
  return t;
}

void check_problem(const Problem& p) {
  REDCO_CHECK(p.M >= 0 && p.N >= 0 && p.K >= 0, "sgemm: negative size M={} N={} K={}", p.M, p.N,
              p.K);
  const int64_t a_cols = p.ta ? p.M : p.K, b_cols = p.tb ? p.K : p.N;
  REDCO_CHECK(p.lda >= std::max<int64_t>(1, a_cols),
              "sgemm: lda={} is smaller than the {} columns of A (trans_a={})", p.lda, a_cols,
              p.ta);
  REDCO_CHECK(p.ldb >= std::max<int64_t>(1, b_cols),
              "sgemm: ldb={} is smaller than the {} columns of B (trans_b={})", p.ldb, b_cols,
              p.tb);
  REDCO_CHECK(p.ldc >= std::max<int64_t>(1, p.N), "sgemm: ldc={} is smaller than N={}", p.ldc, p.N);
  const bool empty = p.M == 0 || p.N == 0;
  REDCO_CHECK(empty || p.C != nullptr, "sgemm: C is null for a {}x{} output", p.M, p.N);
  REDCO_CHECK(empty || p.K == 0 || p.alpha == 0.f || (p.A != nullptr && p.B != nullptr),
              "sgemm: A or B is null for M={} N={} K={}", p.M, p.N, p.K);
}

// Tiles per batch entry such that batch * tiles splits evenly over the
// threads (3 entries on 2 threads: 6 tiles, not 3 entries with one thread
// idle for a third of the time). Large batches balance on their own.
int64_t tiles_per_entry(int64_t batch, int64_t concurrency) {
  if (batch >= 4 * concurrency) return 1;
  return concurrency / std::gcd(batch, concurrency);
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  sgemm_batched(1, trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0);
}

// Every (batch entry, tile) pair is one unit of work. Small entries are
// grouped by the grain so that a TBB task still carries kMinTileMacs.
void sgemm_batched(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const float* A, int64_t lda, int64_t stride_a, const float* B,
                   int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                   int64_t stride_c) {
  const Problem p{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
  REDCO_CHECK(batch >= 0, "sgemm_batched: negative batch {}", batch);
  check_problem(p);
  REDCO_CHECK(batch <= 1 || stride_c != 0 || M == 0 || N == 0,
              "sgemm_batched: stride_c = 0 would make {} products write the same C", batch);
  if (batch == 0 || M == 0 || N == 0) return;

  const int64_t concurrency = tbb::this_task_arena::max_concurrency();
  const Grid grid = choose_grid(M, N, K, tiles_per_entry(batch, concurrency));
  const int64_t units = batch * grid.tiles();
  auto run_unit = [&](int64_t u) {
    const int64_t b = u / grid.tiles();
    Problem q = p;  // A and B may be null when they are not read (K == 0, alpha == 0)
    if (q.A != nullptr) q.A += b * stride_a;
    if (q.B != nullptr) q.B += b * stride_b;
    q.C += b * stride_c;
    serial_gemm(tile(q, grid, u % grid.tiles()));
  };
  const int64_t unit_macs = std::max<int64_t>(1, M * N * K / grid.tiles());
  if (concurrency <= 1 || units * unit_macs < 2 * kMinTileMacs) {
    for (int64_t u = 0; u < units; ++u) run_unit(u);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kMinTileMacs / unit_macs);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, units, grain), [&](const auto& r) {
    for (int64_t u = r.begin(); u < r.end(); ++u) run_unit(u);
  });
}

// ------------------------------------------------------------------ bf16 --

namespace {

void dnnl_ok(dnnl_status_t st, const char* what) {
  REDCO_CHECK(st == dnnl_success, "gemm_bf16: oneDNN {} failed (status {})", what,
              static_cast<int>(st));
}

dnnl_engine_t cpu_engine() {
  static dnnl_engine_t engine = [] {
    dnnl_engine_t e = nullptr;
    dnnl_ok(dnnl_engine_create(&e, dnnl_cpu, 0), "engine creation");
    return e;
  }();
  return engine;
}

// One matmul primitive for one tile geometry, with memory objects whose data
// handles are pointed at each call's operands. Kept per thread (a oneDNN
// stream and memory objects are not shared between threads) for the life of
// the thread: a model has a handful of GEMM shapes.
struct Bf16Kernel {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_t a = nullptr, b = nullptr, c = nullptr;
};

// trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate
using Bf16Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

dnnl_memory_t make_memory(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                          dnnl_data_type_t type) {
  const dnnl_dims_t dims{rows, cols}, strides{row_stride, col_stride};
  dnnl_memory_desc_t md;
  dnnl_ok(dnnl_memory_desc_init_by_strides(&md, 2, dims, type, strides), "memory descriptor");
  dnnl_memory_t m = nullptr;
  dnnl_ok(dnnl_memory_create(&m, &md, cpu_engine(), DNNL_MEMORY_NONE), "memory creation");
  return m;
}

Bf16Kernel make_kernel(const Bf16Key& key) {
  const auto [ta, tb, M, N, K, lda, ldb, ldc, accumulate] = key;
  Bf16Kernel k;
  k.a = make_memory(M, K, ta ? 1 : lda, ta ? lda : 1, dnnl_bf16);  // op(A) [M, K]
  k.b = make_memory(K, N, tb ? 1 : ldb, tb ? ldb : 1, dnnl_bf16);  // op(B) [K, N]
  k.c = make_memory(M, N, ldc, 1, dnnl_f32);                       // C [M, N]
  const dnnl_memory_desc_t *a_md, *b_md, *c_md;
  dnnl_ok(dnnl_memory_get_memory_desc(k.a, &a_md), "memory descriptor query");
  dnnl_ok(dnnl_memory_get_memory_desc(k.b, &b_md), "memory descriptor query");
  dnnl_ok(dnnl_memory_get_memory_desc(k.c, &c_md), "memory descriptor query");
  dnnl_matmul_desc_t desc;
  dnnl_ok(dnnl_matmul_desc_init(&desc, a_md, b_md, nullptr, c_md), "matmul descriptor");
  // C += product: a sum post-op, which reads C before the kernel writes it.
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post_ops = nullptr;
  if (accumulate) {
    dnnl_ok(dnnl_primitive_attr_create(&attr), "attribute creation");
    dnnl_ok(dnnl_post_ops_create(&post_ops), "post-op creation");
    dnnl_ok(dnnl_post_ops_append_sum(post_ops, 1.f), "sum post-op");
    dnnl_ok(dnnl_primitive_attr_set_post_ops(attr, post_ops), "setting post-ops");
  }
  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t made = dnnl_primitive_desc_create(&pd, &desc, attr, cpu_engine(), nullptr);
  if (post_ops) dnnl_post_ops_destroy(post_ops);
  if (attr) dnnl_primitive_attr_destroy(attr);
  REDCO_CHECK(made != dnnl_unimplemented,
              "gemm_bf16: oneDNN has no bf16 matmul for this CPU (it needs AVX512_BF16 or AMX); "
              "leave the bf16 GEMM path on automatic, which rounds to bf16 and runs sgemm here");
  dnnl_ok(made, "bf16 matmul primitive descriptor");
  const dnnl_status_t st = dnnl_primitive_create(&k.prim, pd);
  dnnl_primitive_desc_destroy(pd);
  dnnl_ok(st, "bf16 matmul primitive creation");
  return k;
}

struct Bf16Cache {
  dnnl_stream_t stream = nullptr;
  std::map<Bf16Key, Bf16Kernel> kernels;
  ~Bf16Cache() {
    for (auto& [key, k] : kernels) {
      dnnl_primitive_destroy(k.prim);
      dnnl_memory_destroy(k.a);
      dnnl_memory_destroy(k.b);
      dnnl_memory_destroy(k.c);
    }
    if (stream) dnnl_stream_destroy(stream);
  }
};

// One tile on the calling thread.
void serial_gemm_bf16(const Bf16Key& key, const uint16_t* A, const uint16_t* B, float* C) {
  thread_local Bf16Cache cache;
  if (!cache.stream) dnnl_ok(dnnl_stream_create(&cache.stream, cpu_engine(), 0), "stream");
  auto it = cache.kernels.find(key);
  if (it == cache.kernels.end()) it = cache.kernels.emplace(key, make_kernel(key)).first;
  const Bf16Kernel& k = it->second;
  OmpPin pin;
  dnnl_ok(dnnl_memory_set_data_handle(k.a, const_cast<uint16_t*>(A)), "set data");
  dnnl_ok(dnnl_memory_set_data_handle(k.b, const_cast<uint16_t*>(B)), "set data");
  dnnl_ok(dnnl_memory_set_data_handle(k.c, C), "set data");
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, k.a}, {DNNL_ARG_WEIGHTS, k.b}, {DNNL_ARG_DST, k.c}};
  dnnl_ok(dnnl_primitive_execute(k.prim, cache.stream, 3, args), "bf16 matmul");
  dnnl_ok(dnnl_stream_wait(cache.stream), "stream wait");
}

}  // namespace

bool has_native_bf16() {
  static const bool native =
      (unsigned(dnnl_get_effective_cpu_isa()) & unsigned(dnnl_cpu_isa_avx512_core_bf16)) ==
      unsigned(dnnl_cpu_isa_avx512_core_bf16);
  return native;
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
               bool accumulate) {
  REDCO_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0 || (K == 0 && accumulate)) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    return;
  }
  const Grid grid = choose_grid(M, N, K, tbb::this_task_arena::max_concurrency());
  auto run_tile = [&](int64_t index) {
    const int64_t im = index / grid.tn, in = index % grid.tn;
    const int64_t m0 = cut(M, grid.tm, im), m1 = cut(M, grid.tm, im + 1);
    const int64_t n0 = cut(N, grid.tn, in), n1 = cut(N, grid.tn, in + 1);
    const Bf16Key key{trans_a, trans_b, m1 - m0, n1 - n0, K, lda, ldb, ldc, accumulate};
    serial_gemm_bf16(key, A + (trans_a ? m0 : m0 * lda), B + (trans_b ? n0 * ldb : n0),
                     C + m0 * ldc + n0);
  };
  if (grid.tiles() == 1) return run_tile(0);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, grid.tiles(), 1), [&](const auto& r) {
    for (int64_t t = r.begin(); t < r.end(); ++t) run_tile(t);
  });
}

namespace {

// One layer-sized product (512 x 768 x 768, as GPT-2 small's projections)
// both ways: how much faster gemm_bf16 is than sgemm.
double bf16_gemm_speedup() {
  constexpr int64_t M = 512, N = 768, K = 768;
  const std::vector<uint16_t> a16(size_t(M * K), 0x3f80), b16(size_t(K * N), 0x3f80);  // 1.0
  const std::vector<float> a(size_t(M * K), 1.f), b(size_t(K * N), 1.f);
  std::vector<float> c(size_t(M * N));
  const double t16 = best_of_three(
      [&] { gemm_bf16(false, true, M, N, K, a16.data(), K, b16.data(), K, c.data(), N); });
  const double t32 = best_of_three(
      [&] { sgemm(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, c.data(), N); });
  return t32 / t16;
}

}  // namespace

bool bf16_gemm_pays() {
  static const bool pays = [] {
    const char* env = std::getenv("REDCO_BF16_GEMM");
    const std::string choice = env ? env : "";
    REDCO_CHECK(choice.empty() || choice == "onednn" || choice == "sgemm",
                "REDCO_BF16_GEMM is '{}': use onednn (bf16 dot products), sgemm (f32 GEMMs on "
                "operands rounded to bf16) or leave it unset (measured once)",
                choice);
    if (!choice.empty()) return choice == "onednn";
    if (!has_native_bf16()) return false;
    const auto isa = unsigned(dnnl_get_effective_cpu_isa());
    if ((isa & unsigned(dnnl_cpu_isa_avx512_core_amx)) == unsigned(dnnl_cpu_isa_avx512_core_amx))
      return true;
    return bf16_gemm_speedup() >= 1.25;
  }();
  return pays;
}

}  // namespace redco::cpu
