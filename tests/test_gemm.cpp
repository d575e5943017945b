// redco::cpu::sgemm / sgemm_batched against a double-precision naive reference.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/gemm.hpp"

namespace {

using redco::cpu::sgemm;
using redco::cpu::sgemm_batched;

struct Case {
  bool ta = false, tb = false;
  int64_t M = 1, N = 1, K = 1;
  float alpha = 1.f, beta = 0.f;
  int64_t pad = 0;  // extra columns in every leading dimension
  int64_t lda() const { return (ta ? M : K) + pad; }
  int64_t ldb() const { return (tb ? K : N) + pad; }
  int64_t ldc() const { return N + pad; }
  int64_t a_size() const { return (ta ? K : M) * lda(); }
  int64_t b_size() const { return (tb ? N : K) * ldb(); }
  int64_t c_size() const { return M * ldc(); }
};

std::vector<float> random_vec(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// Checks C (ldc-strided) against alpha*op(A)op(B) + beta*C0 computed in double.
// Each element's tolerance scales with the magnitudes that were summed, which
// bounds float rounding whatever the summation order. The padding columns
// between N and ldc must be left exactly as they were in C0.
void expect_matches(const Case& c, const float* A, const float* B, const float* C0,
                    const float* C) {
  double worst = 0.0;
  int64_t bad = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = c.ta ? A[k * c.lda() + i] : A[i * c.lda() + k];
        const double b = c.tb ? B[j * c.ldb() + k] : B[k * c.ldb() + j];
        sum += a * b;
        mag += std::abs(a * b);
      }
      const double c0 = c.beta == 0.f ? 0.0 : static_cast<double>(C0[i * c.ldc() + j]);
      const double ref = c.alpha * sum + c.beta * c0;
      const double tol = 1e-5 * (std::abs(c.alpha) * mag + std::abs(c.beta * c0)) + 1e-30;
      const double err = std::abs(C[i * c.ldc() + j] - ref);  // NaN fails the comparison below
      worst = std::max(worst, err / tol);
      if (!(err <= tol)) ++bad;
    }
    const int64_t pad_bytes = (c.ldc() - c.N) * static_cast<int64_t>(sizeof(float));
    if (std::memcmp(C + i * c.ldc() + c.N, C0 + i * c.ldc() + c.N, pad_bytes) != 0) ++bad;
  }
  INFO("ta=" << c.ta << " tb=" << c.tb << " M=" << c.M << " N=" << c.N << " K=" << c.K << " alpha="
             << c.alpha << " beta=" << c.beta << " pad=" << c.pad << " worst err/tol=" << worst);
  CHECK(bad == 0);
}

// Runs one sgemm on random data; with nan_c the initial C is all NaN.
void run_case(const Case& c, bool nan_c = false) {
  const auto A = random_vec(c.a_size(), 1);
  const auto B = random_vec(c.b_size(), 2);
  auto C0 = random_vec(c.c_size(), 3);
  if (nan_c) std::fill(C0.begin(), C0.end(), std::numeric_limits<float>::quiet_NaN());
  auto C = C0;
  sgemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), c.lda(), B.data(), c.ldb(), c.beta, C.data(),
        c.ldc());
  expect_matches(c, A.data(), B.data(), C0.data(), C.data());
}

#ifdef __linux__
int64_t thread_count() {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}
#endif

}  // namespace

#ifdef __linux__
// First in the file: an OpenMP team started by any earlier test would hide a new one.
TEST_CASE("sgemm: uses the TBB arena's threads and starts no OpenMP team", "[gemm]") {
  tbb::task_arena arena(2);
  arena.execute([] {
    // Make sure the arena's worker exists before counting threads: both
    // slots must be seen inside one parallel loop (bounded wait, since a
    // single-core machine may never run them together).
    std::atomic<int> seen{0};
    tbb::parallel_for(0, 2, [&](int) {
      seen.fetch_add(1);
      for (int spin = 0; spin < 200000 && seen.load() < 2; ++spin) std::this_thread::yield();
    });
    const int64_t before = thread_count();
    run_case(Case{.M = 512, .N = 512, .K = 256, .alpha = 1.f, .beta = 0.f});
    CHECK(thread_count() == before);
  });
}
#endif

TEST_CASE("sgemm: all transposes, odd sizes, padded leading dims, alpha and beta", "[gemm]") {
  // 1 and 7 take the inline tiny path, 129 and mixes of them take oneDNN.
  const int64_t sizes[] = {1, 7, 129};
  for (int t = 0; t < 4; ++t) {
    for (int64_t M : sizes) {
      for (int64_t N : sizes) {
        for (int64_t K : sizes) {
          Case c{.ta = (t & 1) != 0, .tb = (t & 2) != 0, .M = M, .N = N, .K = K};
          c.alpha = 0.75f;
          c.beta = -0.5f;
          c.pad = 3;
          run_case(c);
        }
      }
    }
  }
}

TEST_CASE("sgemm: beta = 0 overwrites a NaN-filled C", "[gemm]") {
  // tiny path, single oneDNN call, and a size big enough to be split into tiles
  const int64_t sizes[][3] = {{3, 5, 2}, {33, 65, 17}, {300, 257, 301}};
  for (int t = 0; t < 4; ++t) {
    for (const auto& s : sizes) {
      Case c{.ta = (t & 1) != 0, .tb = (t & 2) != 0, .M = s[0], .N = s[1], .K = s[2]};
      c.alpha = 1.5f;
      c.pad = 5;
      run_case(c, /*nan_c=*/true);
    }
  }
}

TEST_CASE("sgemm: beta = 1 accumulates and alpha = 0 or K = 0 only scale C", "[gemm]") {
  run_case(Case{.M = 40, .N = 50, .K = 60, .alpha = -2.f, .beta = 1.f, .pad = 1});
  run_case(Case{.ta = true, .M = 4, .N = 4, .K = 4, .alpha = 1.f, .beta = 1.f});

  // BLAS semantics: with alpha = 0 or K = 0, A and B are not read (null is fine).
  for (const auto& [K, alpha] : {std::pair<int64_t, float>{0, 1.f}, {64, 0.f}}) {
    const Case c{.M = 70, .N = 90, .K = K, .alpha = alpha, .beta = 0.25f, .pad = 2};
    auto C0 = random_vec(c.c_size(), 4), C = C0;
    sgemm(false, false, c.M, c.N, c.K, c.alpha, nullptr, std::max<int64_t>(1, c.K), nullptr,
          c.ldb(), c.beta, C.data(), c.ldc());
    const std::vector<float> zeros(static_cast<size_t>(std::max(c.a_size(), c.b_size()) + 1));
    expect_matches(c, zeros.data(), zeros.data(), C0.data(), C.data());
  }
  // Empty outputs touch nothing.
  sgemm(false, false, 0, 5, 5, 1.f, nullptr, 5, nullptr, 5, 0.f, nullptr, 5);
}

TEST_CASE("sgemm: large products split across TBB threads match the reference", "[gemm]") {
  // 3 and 4 give 3x1 and 2x2 tile grids; on a smaller machine TBB warns that it
  // caps the workers, but the tiles are still cut for the arena's concurrency.
  for (int threads : {1, 2, 3, 4}) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      for (int t = 0; t < 4; ++t) {
        Case c{.ta = (t & 1) != 0, .tb = (t & 2) != 0, .M = 515, .N = 389, .K = 270};
        c.alpha = 0.5f;
        c.beta = t == 0 ? 0.f : 2.f;
        c.pad = 7;
        run_case(c, c.beta == 0.f);
      }
      // one long, thin output: the grid splits N, not M
      run_case(Case{.tb = true, .M = 20, .N = 4099, .K = 200, .alpha = 1.f, .beta = 0.f});
    });
  }
}

TEST_CASE("sgemm_batched: strided, broadcast (stride 0) and many tiny entries", "[gemm]") {
  struct Batched {
    int64_t batch;
    Case c;
    bool broadcast_a, broadcast_b;
  };
  const Batched cases[] = {
      {5, Case{.M = 33, .N = 70, .K = 21, .alpha = 1.f, .beta = 0.5f, .pad = 2}, false, false},
      {4, Case{.tb = true, .M = 64, .N = 64, .K = 48, .alpha = 2.f, .beta = 0.f}, true, false},
      {3, Case{.ta = true, .M = 300, .N = 200, .K = 100, .alpha = 1.f, .beta = 1.f}, false, true},
      {300, Case{.ta = true, .tb = true, .M = 4, .N = 3, .K = 5, .alpha = 1.f}, false, false},
  };
  for (const auto& [batch, c, bcast_a, bcast_b] : cases) {
    // entries sit apart by their size plus a gap; a broadcast operand is stored once
    const int64_t sa = bcast_a ? 0 : c.a_size() + 11, sb = bcast_b ? 0 : c.b_size() + 13;
    const int64_t sc = c.c_size() + 17;
    const auto A = random_vec(sa * (batch - 1) + c.a_size(), 5);
    const auto B = random_vec(sb * (batch - 1) + c.b_size(), 6);
    auto C0 = random_vec(sc * batch, 7);
    if (c.beta == 0.f) std::fill(C0.begin(), C0.end(), std::numeric_limits<float>::quiet_NaN());
    auto C = C0;
    sgemm_batched(batch, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), c.lda(), sa, B.data(),
                  c.ldb(), sb, c.beta, C.data(), c.ldc(), sc);
    for (int64_t b = 0; b < batch; ++b) {
      expect_matches(c, A.data() + b * sa, B.data() + b * sb, C0.data() + b * sc,
                     C.data() + b * sc);
      // the gap after each output is not written
      for (int64_t g = c.c_size(); g < sc; ++g)
        REQUIRE(std::isnan(C[b * sc + g]) == std::isnan(C0[b * sc + g]));
    }
  }
}

TEST_CASE("sgemm: nested inside a TBB parallel loop", "[gemm]") {
  const Case c{.tb = true, .M = 200, .N = 150, .K = 130, .alpha = 1.f, .beta = 0.f};
  const auto A = random_vec(c.a_size(), 8), B = random_vec(c.b_size(), 9);
  const int64_t jobs = 6;
  std::vector<float> C(static_cast<size_t>(jobs * c.c_size()));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, jobs, 1), [&](const auto& r) {
    for (int64_t j = r.begin(); j < r.end(); ++j)
      sgemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), c.lda(), B.data(), c.ldb(), c.beta,
            C.data() + j * c.c_size(), c.ldc());
  });
  const std::vector<float> C0(static_cast<size_t>(c.c_size()));
  for (int64_t j = 0; j < jobs; ++j)
    expect_matches(c, A.data(), B.data(), C0.data(), C.data() + j * c.c_size());
}

TEST_CASE("sgemm: rejects bad arguments with redco::Error", "[gemm]") {
  std::vector<float> a(64, 1.f), b(64, 1.f), c(64, 0.f);
  // lda smaller than the K columns of A
  CHECK_THROWS_AS(sgemm(false, false, 4, 4, 4, 1.f, a.data(), 3, b.data(), 4, 0.f, c.data(), 4),
                  redco::Error);
  // trans_b: B is [N, K] so ldb must cover K
  CHECK_THROWS_AS(sgemm(false, true, 4, 8, 2, 1.f, a.data(), 2, b.data(), 1, 0.f, c.data(), 8),
                  redco::Error);
  CHECK_THROWS_AS(sgemm(false, false, 4, 4, 4, 1.f, a.data(), 4, b.data(), 4, 0.f, c.data(), 2),
                  redco::Error);
  CHECK_THROWS_AS(sgemm(false, false, -1, 4, 4, 1.f, a.data(), 4, b.data(), 4, 0.f, c.data(), 4),
                  redco::Error);
  // two entries writing one C would race
  CHECK_THROWS_AS(sgemm_batched(2, false, false, 2, 2, 2, 1.f, a.data(), 2, 4, b.data(), 2, 4, 0.f,
                                c.data(), 2, 0),
                  redco::Error);
}
