// Fused norm / softmax / cross-entropy / activation kernels against naive
// double-precision references; backward passes against central finite
// differences of those references (small sizes) or their analytic gradients
// (sizes that exercise the threaded paths).
#include <tbb/task_arena.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/activation.hpp"
#include "redco/ops/cpu/norm.hpp"
#include "redco/ops/cpu/softmax.hpp"

namespace {

using namespace redco::cpu;
using Vd = std::vector<double>;
using Vf = std::vector<float>;

Vf randn(int64_t n, uint64_t seed, float mean = 0.f, float stddev = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  Vf v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

Vd to_d(const Vf& v) { return Vd(v.begin(), v.end()); }

// Every |got - want| <= atol + rtol |want|, and got is finite; reports the worst.
void check_close(const Vf& got, const Vd& want, double atol, double rtol, const char* what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  size_t wi = 0;
  bool finite = true;
  for (size_t i = 0; i < got.size(); ++i) {
    finite = finite && std::isfinite(got[i]);
    const double r = std::abs(got[i] - want[i]) / (atol + rtol * std::abs(want[i]));
    if (!(r <= worst)) worst = r, wi = i;
  }
  INFO(what << ": worst at " << wi << " got " << got[wi] << " want " << want[wi]
            << " (ratio to tolerance " << worst << ")");
  CHECK(finite);
  CHECK(worst <= 1.0);
}

// Central differences of a scalar loss w.r.t. every entry of p (restored after).
Vd fd_grad(Vd& p, const std::function<double()>& loss, double h = 1e-5) {
  Vd g(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double v = p[i];
    p[i] = v + h;
    const double lp = loss();
    p[i] = v - h;
    const double lm = loss();
    p[i] = v;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

double dot(const Vd& a, const Vd& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- double references --------------------------------------------------------

// y [N,D]; mean, rstd [N]. beta may be empty.
Vd ln_ref(const Vd& x, const Vd& g, const Vd& b, int64_t N, int64_t D, double eps,
          Vd* mean = nullptr, Vd* rstd = nullptr) {
  Vd y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    const double* xr = &x[n * D];
    double m = 0, v = 0;
    for (int64_t j = 0; j < D; ++j) m += xr[j];
    m /= D;
    for (int64_t j = 0; j < D; ++j) v += (xr[j] - m) * (xr[j] - m);
    const double r = 1 / std::sqrt(v / D + eps);
    for (int64_t j = 0; j < D; ++j)
      y[n * D + j] = (xr[j] - m) * r * g[j] + (b.empty() ? 0.0 : b[j]);
    if (mean) (*mean)[n] = m;
    if (rstd) (*rstd)[n] = r;
  }
  return y;
}

Vd rms_ref(const Vd& x, const Vd& g, int64_t N, int64_t D, double eps, Vd* rstd = nullptr) {
  Vd y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += x[n * D + j] * x[n * D + j];
    const double r = 1 / std::sqrt(ss / D + eps);
    for (int64_t j = 0; j < D; ++j) y[n * D + j] = x[n * D + j] * r * g[j];
    if (rstd) (*rstd)[n] = r;
  }
  return y;
}

// Analytic layer-norm gradients in double (checked against FD below).
void ln_grad_ref(const Vd& dy, const Vd& x, const Vd& g, int64_t N, int64_t D, double eps, Vd& dx,
                 Vd& dg, Vd& db) {
  Vd mean(N), rstd(N);
  ln_ref(x, g, {}, N, D, eps, &mean, &rstd);
  dx.assign(x.size(), 0);
  dg.assign(D, 0);
  db.assign(D, 0);
  for (int64_t n = 0; n < N; ++n) {
    double a = 0, b = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double xh = (x[n * D + j] - mean[n]) * rstd[n];
      a += dy[n * D + j] * g[j];
      b += dy[n * D + j] * g[j] * xh;
      dg[j] += dy[n * D + j] * xh;
      db[j] += dy[n * D + j];
    }
    for (int64_t j = 0; j < D; ++j) {
      const double xh = (x[n * D + j] - mean[n]) * rstd[n];
      dx[n * D + j] = rstd[n] * (dy[n * D + j] * g[j] - a / D - xh * b / D);
    }
  }
}

Vd softmax_ref(const Vd& x, int64_t N, int64_t D, bool log_space) {
  Vd y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    const double* xr = &x[n * D];
    const double m = *std::max_element(xr, xr + D);
    double s = 0;
    for (int64_t j = 0; j < D; ++j) s += std::exp(xr[j] - m);
    for (int64_t j = 0; j < D; ++j)
      y[n * D + j] = log_space ? xr[j] - m - std::log(s) : std::exp(xr[j] - m) / s;
  }
  return y;
}

constexpr int64_t kIgnore = -100;

// losses [N]; ignored rows 0.
Vd ce_ref(const Vd& x, const std::vector<int64_t>& labels, int64_t N, int64_t V,
          int64_t ignore = kIgnore) {
  const Vd lp = softmax_ref(x, N, V, true);
  Vd loss(N, 0.0);
  for (int64_t n = 0; n < N; ++n)
    if (labels[n] != ignore) loss[n] = -lp[n * V + labels[n]];
  return loss;
}

double gelu_ref(double x, bool tanh_approx) {
  if (tanh_approx)
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double silu_ref(double x) { return x / (1 + std::exp(-x)); }

const int64_t kOddDims[] = {1, 3, 17, 1000};

}  // namespace

// ---- layer norm ---------------------------------------------------------------

TEST_CASE("layer_norm forward matches double reference", "[norm]") {
  const float eps = 1e-5f;
  for (int64_t D : kOddDims) {
    for (bool with_beta : {true, false}) {
      const int64_t N = 5;
      Vf x = randn(N * D, D), g = randn(D, D + 1, 1.f, 0.5f), b = randn(D, D + 2);
      Vf y(N * D), mean(N), rstd(N);
      layer_norm_forward(x.data(), g.data(), with_beta ? b.data() : nullptr, y.data(), mean.data(),
                         rstd.data(), N, D, eps);
      Vd rm(N), rr(N);
      const Vd ry = ln_ref(to_d(x), to_d(g), with_beta ? to_d(b) : Vd{}, N, D, eps, &rm, &rr);
      INFO("D=" << D << " beta=" << with_beta);
      check_close(y, ry, 1e-5, 1e-5, "y");
      check_close(mean, rm, 1e-6, 1e-6, "mean");
      check_close(rstd, rr, 1e-6, 1e-5, "rstd");
    }
  }
}

TEST_CASE("layer_norm statistics stay accurate for large means and D=8192", "[norm]") {
  const int64_t N = 4, D = 8192;
  for (float mu : {1e3f, 1e4f}) {
    Vf x = randn(N * D, 7, mu, 1.f), g = randn(D, 8, 1.f, 0.5f), b = randn(D, 9);
    Vf y(N * D), mean(N), rstd(N);
    layer_norm_forward(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), N, D,
                       1e-5f);
    Vd rm(N), rr(N);
    const Vd ry = ln_ref(to_d(x), to_d(g), to_d(b), N, D, 1e-5, &rm, &rr);
    INFO("mean=" << mu);
    check_close(y, ry, 2e-5, 2e-5, "y");
    check_close(mean, rm, 0, 1e-7, "mean");
    check_close(rstd, rr, 0, 2e-6, "rstd");

    // Backward from the float-rounded saved mean still sees accurate xhat.
    Vf dy = randn(N * D, 10), dx(N * D), dg(D), db(D);
    layer_norm_backward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(),
                        dg.data(), db.data(), N, D);
    Vd rdx, rdg, rdb;
    ln_grad_ref(to_d(dy), to_d(x), to_d(g), N, D, 1e-5, rdx, rdg, rdb);
    check_close(dx, rdx, 1e-4, 1e-4, "dx");
    check_close(dg, rdg, 1e-4, 1e-4, "dgamma");
    check_close(db, rdb, 1e-5, 1e-5, "dbeta");
  }
}

TEST_CASE("layer_norm backward matches finite differences", "[norm]") {
  const double eps = 1e-5;
  for (int64_t D : kOddDims) {
    for (bool with_beta : {true, false}) {
      const int64_t N = 3;
      Vf x = randn(N * D, 20 + D), g = randn(D, 21, 1.f, 0.5f), b = randn(D, 22);
      Vf w = randn(N * D, 23);  // dL/dy
      Vf y(N * D), mean(N), rstd(N), dx(N * D), dg(D), db(D);
      const float* bp = with_beta ? b.data() : nullptr;
      layer_norm_forward(x.data(), g.data(), bp, y.data(), mean.data(), rstd.data(), N, D,
                         static_cast<float>(eps));
      layer_norm_backward(w.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(),
                          dg.data(), with_beta ? db.data() : nullptr, N, D);

      Vd xd = to_d(x), gd = to_d(g), bd = to_d(b), wd = to_d(w);
      auto loss = [&] { return dot(wd, ln_ref(xd, gd, with_beta ? bd : Vd{}, N, D, eps)); };
      INFO("D=" << D << " beta=" << with_beta);
      check_close(dx, fd_grad(xd, loss), 2e-5, 1e-4, "dx");
      check_close(dg, fd_grad(gd, loss), 2e-5, 1e-4, "dgamma");
      if (with_beta) check_close(db, fd_grad(bd, loss), 2e-5, 1e-4, "dbeta");
    }
  }
}

TEST_CASE("layer_norm threaded path matches analytic double gradients", "[norm]") {
  const int64_t N = 301, D = 1000;
  Vf x = randn(N * D, 30, 0.5f, 2.f), g = randn(D, 31, 1.f, 0.5f), dy = randn(N * D, 32);
  Vf y(N * D), mean(N), rstd(N), dx(N * D), dg(D), db(D);
  layer_norm_forward(x.data(), g.data(), nullptr, y.data(), mean.data(), rstd.data(), N, D, 1e-5f);
  check_close(y, ln_ref(to_d(x), to_d(g), {}, N, D, 1e-5), 1e-5, 1e-5, "y");
  layer_norm_backward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                      db.data(), N, D);
  Vd rdx, rdg, rdb;
  ln_grad_ref(to_d(dy), to_d(x), to_d(g), N, D, 1e-5, rdx, rdg, rdb);
  check_close(dx, rdx, 1e-5, 1e-4, "dx");
  check_close(dg, rdg, 1e-4, 1e-4, "dgamma");
  check_close(db, rdb, 1e-4, 1e-4, "dbeta");
}

// ---- RMS norm -----------------------------------------------------------------

TEST_CASE("rms_norm forward and backward match the double reference", "[norm]") {
  const double eps = 1e-6;
  for (int64_t D : kOddDims) {
    const int64_t N = 3;
    Vf x = randn(N * D, 40 + D, 0.3f, 1.f), g = randn(D, 41, 1.f, 0.5f), w = randn(N * D, 42);
    Vf y(N * D), rstd(N), dx(N * D), dg(D);
    rms_norm_forward(x.data(), g.data(), y.data(), rstd.data(), N, D, static_cast<float>(eps));
    Vd rr(N);
    Vd xd = to_d(x), gd = to_d(g), wd = to_d(w);
    INFO("D=" << D);
    check_close(y, rms_ref(xd, gd, N, D, eps, &rr), 1e-5, 1e-5, "y");
    check_close(rstd, rr, 0, 1e-5, "rstd");

    rms_norm_backward(w.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), N, D);
    auto loss = [&] { return dot(wd, rms_ref(xd, gd, N, D, eps)); };
    check_close(dx, fd_grad(xd, loss), 2e-5, 1e-4, "dx");
    check_close(dg, fd_grad(gd, loss), 2e-5, 1e-4, "dgamma");
  }
}

// ---- determinism of the N-reductions -----------------------------------------

TEST_CASE("dgamma/dbeta are bitwise reproducible across runs and thread counts", "[norm]") {
  const int64_t N = 4099, D = 768;  // 64 chunks of 65 rows, the last one short
  Vf x = randn(N * D, 50, 0.1f, 1.5f), g = randn(D, 51, 1.f, 0.5f), dy = randn(N * D, 52);
  Vf y(N * D), mean(N), rstd(N);
  layer_norm_forward(x.data(), g.data(), nullptr, y.data(), mean.data(), rstd.data(), N, D, 1e-5f);
  Vf rrstd(N);
  rms_norm_forward(x.data(), g.data(), y.data(), rrstd.data(), N, D, 1e-5f);

  auto run = [&](Vf& dx, Vf& dg, Vf& db, Vf& rdx, Vf& rdg) {
    dx.assign(N * D, 0.f), dg.assign(D, 0.f), db.assign(D, 0.f);
    rdx.assign(N * D, 0.f), rdg.assign(D, 0.f);
    layer_norm_backward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(),
                        dg.data(), db.data(), N, D);
    rms_norm_backward(dy.data(), x.data(), g.data(), rrstd.data(), rdx.data(), rdg.data(), N, D);
  };
  Vf dx0, dg0, db0, rdx0, rdg0;
  run(dx0, dg0, db0, rdx0, rdg0);
  const auto same = [](const Vf& a, const Vf& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  for (int threads : {1, 2, 3, 0, 0}) {
    Vf dx, dg, db, rdx, rdg;
    if (threads > 0) {
      tbb::task_arena arena(threads);
      arena.execute([&] { run(dx, dg, db, rdx, rdg); });
    } else {
      run(dx, dg, db, rdx, rdg);
    }
    INFO("threads=" << threads);
    CHECK(same(dg, dg0));
    CHECK(same(db, db0));
    CHECK(same(dx, dx0));
    CHECK(same(rdg, rdg0));
    CHECK(same(rdx, rdx0));
  }
  Vd rdx, rdg, rdb;
  ln_grad_ref(to_d(dy), to_d(x), to_d(g), N, D, 1e-5, rdx, rdg, rdb);
  check_close(dg0, rdg, 1e-3, 1e-4, "dgamma");
  check_close(db0, rdb, 1e-3, 1e-4, "dbeta");
}

TEST_CASE("norms accept N = 0", "[norm]") {
  Vf g(4, 1.f), dg(4, 7.f), db(4, 7.f);
  layer_norm_backward(nullptr, nullptr, g.data(), nullptr, nullptr, nullptr, dg.data(), db.data(),
                      0, 4);
  CHECK(dg == Vf(4, 0.f));
  CHECK(db == Vf(4, 0.f));
  CHECK_THROWS_AS(
      layer_norm_forward(nullptr, g.data(), nullptr, nullptr, nullptr, nullptr, 1, 0, 1e-5f),
      redco::Error);
}

// ---- softmax / log-softmax ------------------------------------------------------

TEST_CASE("softmax and log_softmax forward/backward match the reference", "[softmax]") {
  for (int64_t D : kOddDims) {
    for (bool log_space : {false, true}) {
      const int64_t N = 3;
      Vf x = randn(N * D, 60 + D, 0.f, 3.f), w = randn(N * D, 61), y(N * D), dx(N * D);
      Vd xd = to_d(x), wd = to_d(w);
      if (log_space) {
        log_softmax_forward(x.data(), y.data(), N, D);
        log_softmax_backward(y.data(), w.data(), dx.data(), N, D);
      } else {
        softmax_forward(x.data(), y.data(), N, D);
        softmax_backward(y.data(), w.data(), dx.data(), N, D);
      }
      INFO("D=" << D << " log=" << log_space);
      check_close(y, softmax_ref(xd, N, D, log_space), 1e-6, 1e-5, "y");
      auto loss = [&] { return dot(wd, softmax_ref(xd, N, D, log_space)); };
      check_close(dx, fd_grad(xd, loss), 1e-5, 1e-4, "dx");
    }
  }
}

TEST_CASE("softmax of huge logits stays finite and exact", "[softmax]") {
  const int64_t N = 64, D = 1003;  // threaded path
  Vf x = randn(N * D, 70, 0.f, 1e4f);
  for (int64_t n = 0; n < N; ++n) x[n * D + n % D] = (n % 2 ? 1e4f : -1e4f);
  Vf y(N * D), ly(N * D);
  softmax_forward(x.data(), y.data(), N, D);
  log_softmax_forward(x.data(), ly.data(), N, D);
  const Vd xd = to_d(x);
  check_close(y, softmax_ref(xd, N, D, false), 1e-7, 1e-5, "softmax");
  check_close(ly, softmax_ref(xd, N, D, true), 1e-4, 1e-6, "log_softmax");
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t j = 0; j < D; ++j) s += y[n * D + j];
    CHECK(s == Approx(1.0).epsilon(1e-5));
  }
}

// ---- cross entropy --------------------------------------------------------------

TEST_CASE("cross_entropy forward matches the reference, including V=50257", "[ce]") {
  for (int64_t V : {1, 3, 17, 1000, 50257}) {
    const int64_t N = V > 1000 ? 5 : 9;
    Vf x = randn(N * V, 80 + V, 0.f, 2.f), loss(N), lse(N);
    std::vector<int64_t> labels(N);
    std::mt19937_64 rng(V);
    for (auto& l : labels) l = static_cast<int64_t>(rng() % V);
    cross_entropy_forward(x.data(), labels.data(), loss.data(), lse.data(), N, V, kIgnore);
    const Vd xd = to_d(x);
    INFO("V=" << V);
    check_close(loss, ce_ref(xd, labels, N, V), 1e-6, 1e-5, "loss");
    Vd rlse(N);
    for (int64_t n = 0; n < N; ++n) {
      double m = *std::max_element(&xd[n * V], &xd[n * V] + V), s = 0;
      for (int64_t j = 0; j < V; ++j) s += std::exp(xd[n * V + j] - m);
      rlse[n] = m + std::log(s);
    }
    check_close(lse, rlse, 1e-6, 1e-6, "lse");
  }
}

TEST_CASE("cross_entropy backward matches finite differences / analytic", "[ce]") {
  for (int64_t V : {1, 3, 17, 1000, 50257}) {
    const int64_t N = V > 1000 ? 37 : 3;  // 37 x 50257 runs threaded
    Vf x = randn(N * V, 90 + V, 0.f, 2.f), dl = randn(N, 91), loss(N), lse(N), dx(N * V);
    std::vector<int64_t> labels(N);
    std::mt19937_64 rng(V + 1);
    for (auto& l : labels) l = static_cast<int64_t>(rng() % V);
    cross_entropy_forward(x.data(), labels.data(), loss.data(), lse.data(), N, V, kIgnore);
    cross_entropy_backward(x.data(), labels.data(), lse.data(), dl.data(), dx.data(), N, V,
                           kIgnore);
    Vd xd = to_d(x);
    const Vd dld = to_d(dl);
    INFO("V=" << V);
    if (V <= 1000) {
      auto f = [&] { return dot(dld, ce_ref(xd, labels, N, V)); };
      check_close(dx, fd_grad(xd, f), 1e-6, 1e-4, "dlogits");
    } else {
      Vd want = softmax_ref(xd, N, V, false);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t j = 0; j < V; ++j) want[n * V + j] *= dld[n];
        want[n * V + labels[n]] -= dld[n];
      }
      check_close(dx, want, 1e-9, 1e-5, "dlogits");
    }
  }
}

TEST_CASE("cross_entropy ignore_index rows give zero loss and zero grad", "[ce]") {
  const int64_t N = 4, V = 17;
  Vf x = randn(N * V, 100, 0.f, 5.f), loss(N, 9.f), lse(N), dl(N, 1.f), dx(N * V, 9.f);
  x[0] = 1e30f;  // garbage in an ignored row must not leak out
  for (int64_t ignore : {kIgnore, int64_t{3}}) {
    const std::vector<int64_t> labels = {ignore, 5, ignore, 16};
    cross_entropy_forward(x.data(), labels.data(), loss.data(), lse.data(), N, V, ignore);
    cross_entropy_backward(x.data(), labels.data(), lse.data(), dl.data(), dx.data(), N, V, ignore);
    INFO("ignore_index=" << ignore);
    const Vd want = ce_ref(to_d(x), labels, N, V, ignore);
    CHECK(loss[0] == 0.f);
    CHECK(loss[2] == 0.f);
    CHECK(loss[1] == Approx(want[1]).epsilon(1e-5));
    CHECK(loss[3] == Approx(want[3]).epsilon(1e-5));
    for (int64_t n : {0, 2})
      CHECK(std::all_of(&dx[n * V], &dx[n * V] + V, [](float v) { return v == 0.f; }));
    CHECK(dx[1 * V + 5] < 0.f);
  }
}

TEST_CASE("cross_entropy rejects out-of-range labels naming row and label", "[ce]") {
  const int64_t N = 4, V = 17;
  Vf x = randn(N * V, 110), loss(N), lse(N), dl(N, 1.f), dx(N * V);
  using Catch::Matchers::Contains;
  for (int64_t bad : {int64_t{17}, int64_t{-1}, int64_t{1} << 40}) {
    const std::vector<int64_t> labels = {0, kIgnore, bad, 1};
    INFO("label=" << bad);
    const std::string lbl = "label " + std::to_string(bad);
    CHECK_THROWS_AS(
        cross_entropy_forward(x.data(), labels.data(), loss.data(), lse.data(), N, V, kIgnore),
        redco::Error);
    CHECK_THROWS_WITH(
        cross_entropy_forward(x.data(), labels.data(), loss.data(), lse.data(), N, V, kIgnore),
        Contains("row 2") && Contains(lbl));
    CHECK_THROWS_WITH(cross_entropy_backward(x.data(), labels.data(), lse.data(), dl.data(),
                                             dx.data(), N, V, kIgnore),
                      Contains("row 2") && Contains(lbl));
  }
}

TEST_CASE("cross_entropy with logits of +-1e4 stays finite", "[ce]") {
  const int64_t N = 6, V = 50257;
  Vf x = randn(N * V, 120, 0.f, 1e4f), loss(N), lse(N), dl(N, 1.f), dx(N * V);
  std::vector<int64_t> labels(N);
  for (int64_t n = 0; n < N; ++n) {
    x[n * V + 7] = 1e4f;
    x[n * V + 9] = -1e4f;
    labels[n] = n % 2 ? 7 : 9;
  }
  x[V + 1234] = 5e4f;  // a row whose label is not the max
  labels[1] = 7;
  cross_entropy_forward(x.data(), labels.data(), loss.data(), lse.data(), N, V, kIgnore);
  cross_entropy_backward(x.data(), labels.data(), lse.data(), dl.data(), dx.data(), N, V, kIgnore);
  check_close(loss, ce_ref(to_d(x), labels, N, V), 1e-5, 1e-6, "loss");
  CHECK(std::all_of(dx.begin(), dx.end(), [](float v) { return std::isfinite(v); }));
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += dx[n * V + j];
    CHECK(std::abs(s) < 1e-3);  // softmax - onehot sums to 0
  }
}

// ---- activations ----------------------------------------------------------------

namespace {
// x covering [-12, 12] densely plus +-100 and +-1e4 tails.
Vf activation_inputs(int64_t n, uint64_t seed) {
  Vf x = randn(n, seed, 0.f, 3.f);
  for (int64_t i = 0; i < n; i += 7) x[i] = -12.f + 24.f * static_cast<float>(i) / n;
  if (n >= 4) x[0] = -1e4f, x[1] = 1e4f, x[2] = -100.f, x[3] = 100.f;
  return x;
}
}  // namespace

TEST_CASE("gelu (tanh and erf) forward/backward match the reference", "[act]") {
  for (bool tanh_approx : {true, false}) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1000}, int64_t{100003}}) {
      Vf x = activation_inputs(n, 130 + n), dy = randn(n, 131), y(n), dx(n);
      gelu_forward(x.data(), y.data(), n, tanh_approx);
      gelu_backward(x.data(), dy.data(), dx.data(), n, tanh_approx);
      Vd ry(n), rdx(n);
      for (int64_t i = 0; i < n; ++i) {
        const double h = 1e-5, xi = x[i];
        ry[i] = gelu_ref(xi, tanh_approx);
        rdx[i] = dy[i] * (gelu_ref(xi + h, tanh_approx) - gelu_ref(xi - h, tanh_approx)) / (2 * h);
      }
      INFO("tanh=" << tanh_approx << " n=" << n);
      check_close(y, ry, 1e-6, 1e-5, "y");
      check_close(dx, rdx, 1e-5, 1e-4, "dx");
    }
  }
}

TEST_CASE("silu forward/backward match the reference", "[act]") {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1000}, int64_t{100003}}) {
    Vf x = activation_inputs(n, 140 + n), dy = randn(n, 141), y(n), dx(n);
    silu_forward(x.data(), y.data(), n);
    silu_backward(x.data(), dy.data(), dx.data(), n);
    Vd ry(n), rdx(n);
    for (int64_t i = 0; i < n; ++i) {
      const double h = 1e-5, xi = x[i];
      ry[i] = silu_ref(xi);
      rdx[i] = dy[i] * (silu_ref(xi + h) - silu_ref(xi - h)) / (2 * h);
    }
    INFO("n=" << n);
    check_close(y, ry, 1e-6, 1e-5, "y");
    check_close(dx, rdx, 1e-5, 1e-4, "dx");
  }
}
