// Embedding, rotary, conv2d and pooling kernels against naive double-precision
// references, finite differences and adjoint identities.
#include <tbb/task_arena.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/core/error.hpp"
#include "redco/ops/cpu/conv.hpp"
#include "redco/ops/cpu/embedding.hpp"
#include "redco/ops/cpu/panel_layout.hpp"
#include "redco/ops/cpu/rotary.hpp"

using namespace redco::cpu;
using Catch::Matchers::Contains;

namespace {

using Vec = std::vector<float>;

Vec randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// max |a - b| relative to max(1, max |b|).
double rel_err(const Vec& a, const std::vector<double>& b) {
  double err = 0, mag = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(a[i]) - b[i]));
    mag = std::max(mag, std::abs(b[i]));
  }
  return err / mag;
}
double rel_err(const Vec& a, const Vec& b) {
  return rel_err(a, std::vector<double>(b.begin(), b.end()));
}

bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Central differences of a scalar loss w.r.t. every entry of v (v restored).
std::vector<double> finite_diff(Vec& v, float eps, const std::function<double()>& loss) {
  std::vector<double> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float old = v[i];
    v[i] = old + eps;
    const double lp = loss();
    v[i] = old - eps;
    const double lm = loss();
    v[i] = old;
    g[i] = (lp - lm) / (2.0 * double(eps));
  }
  return g;
}

}  // namespace

// ============================================================== embedding

TEST_CASE("embedding_forward gathers rows", "[embedding]") {
  const int64_t V = 11, D = 7, n = 9;
  const Vec table = randn(V * D, 1);
  const std::vector<int64_t> ids = {3, 0, 10, 3, 3, 5, 10, 1, 0};
  Vec out(n * D, -1.f);
  embedding_forward(table.data(), ids.data(), out.data(), n, V, D);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) REQUIRE(out[i * D + d] == table[ids[i] * D + d]);

  // Large enough to take the parallel path.
  const int64_t n2 = 5000, D2 = 64;
  const Vec t2 = randn(V * D2, 2);
  std::vector<int64_t> ids2(n2);
  for (int64_t i = 0; i < n2; ++i) ids2[i] = (i * 7) % V;
  Vec out2(n2 * D2);
  embedding_forward(t2.data(), ids2.data(), out2.data(), n2, V, D2);
  for (int64_t i = 0; i < n2; ++i)
    REQUIRE(std::memcmp(&out2[i * D2], &t2[ids2[i] * D2], D2 * sizeof(float)) == 0);
}

TEST_CASE("embedding_forward_bf16 widens exactly the rows it gathers", "[embedding]") {
  const int64_t V = 13, D = 37, n = 6000;  // enough ids for the parallel path
  const Vec table = randn(V * D, 3);
  std::vector<uint16_t> bf(table.size());
  for (size_t i = 0; i < table.size(); ++i) bf[i] = redco::float_to_bf16(table[i]);
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = (i * 5 + 2) % V;
  Vec out(size_t(n * D));
  embedding_forward_bf16(bf.data(), ids.data(), out.data(), n, V, D);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d)
      REQUIRE(out[size_t(i * D + d)] == redco::bf16_to_float(bf[size_t(ids[size_t(i)] * D + d)]));
  ids[7] = V;
  CHECK_THROWS_WITH(embedding_forward_bf16(bf.data(), ids.data(), out.data(), n, V, D),
                    Contains("out of range"));
}

TEST_CASE("embedding_forward_panels gathers the rows of a table packed for decoding",
          "[embedding]") {
  // A tied LM head in decode panels (redco/ops/cpu/panel_layout.hpp): row v of
  // the table is spread over its panel's columns; the lookup reads it back.
  const int64_t V = 45, D = 19, n = 6000;  // a ragged last panel; the parallel path
  const Vec table = randn(V * D, 4);
  std::vector<uint16_t> bf(table.size()), packed(size_t(redco::panels::padded_rows(V) * D), 0);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t d = 0; d < D; ++d) {
      bf[size_t(v * D + d)] = redco::float_to_bf16(table[size_t(v * D + d)]);
      packed[size_t(redco::panels::index(v, d, D))] = bf[size_t(v * D + d)];
    }
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = (i * 7 + 3) % V;
  Vec got(size_t(n * D)), want(size_t(n * D));
  embedding_forward_panels(packed.data(), ids.data(), got.data(), n, V, D);
  embedding_forward_bf16(bf.data(), ids.data(), want.data(), n, V, D);
  CHECK(got == want);
  ids[9] = V;
  CHECK_THROWS_WITH(embedding_forward_panels(packed.data(), ids.data(), got.data(), n, V, D),
                    Contains("out of range"));
}

TEST_CASE("embedding rejects out-of-range ids, naming position and id", "[embedding]") {
  const int64_t V = 5, D = 3;
  const Vec table(V * D, 1.f);
  Vec out(4 * D), dtable(V * D);
  const std::vector<int64_t> too_big = {0, 1, 5, 2};
  REQUIRE_THROWS_AS(embedding_forward(table.data(), too_big.data(), out.data(), 4, V, D),
                    redco::Error);
  REQUIRE_THROWS_WITH(embedding_forward(table.data(), too_big.data(), out.data(), 4, V, D),
                      Contains("id 5") && Contains("position 2"));
  const std::vector<int64_t> negative = {0, -3, 1, 1};
  REQUIRE_THROWS_WITH(embedding_forward(table.data(), negative.data(), out.data(), 4, V, D),
                      Contains("id -3") && Contains("position 1"));
  REQUIRE_THROWS_WITH(embedding_backward(out.data(), too_big.data(), dtable.data(), 4, V, D),
                      Contains("id 5") && Contains("position 2"));
}

TEST_CASE("embedding_backward accumulates repeated ids", "[embedding]") {
  for (int64_t n : {6, 3000}) {  // serial and parallel paths
    const int64_t V = 13, D = 40;
    std::mt19937 rng(7);
    std::vector<int64_t> ids(n);
    for (auto& id : ids) id = rng() % 4 == 0 ? 2 : rng() % V;  // id 2 is hot
    const Vec dout = randn(n * D, 3);
    Vec dtable = randn(V * D, 4);  // accumulated into, not overwritten
    std::vector<double> ref(dtable.begin(), dtable.end());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) ref[ids[i] * D + d] += dout[i * D + d];
    embedding_backward(dout.data(), ids.data(), dtable.data(), n, V, D);
    REQUIRE(rel_err(dtable, ref) < 1e-5);
  }
}

TEST_CASE("embedding_backward is deterministic and equals the serial loop bitwise", "[embedding]") {
  const int64_t n = 60000, V = 37, D = 80;
  std::mt19937 rng(11);
  std::vector<int64_t> ids(n);
  // Heavily repeated: half the positions hit id 0, the rest spread over V.
  for (auto& id : ids) id = rng() % 2 ? 0 : rng() % V;
  const Vec dout = randn(n * D, 5);
  const Vec init = randn(V * D, 6);

  Vec serial = init;  // the reference order: i increasing, in float
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) serial[ids[i] * D + d] += dout[i * D + d];

  auto run = [&] {
    Vec dt = init;
    embedding_backward(dout.data(), ids.data(), dt.data(), n, V, D);
    return dt;
  };
  const Vec a = run(), b = run();
  Vec one_thread;
  tbb::task_arena(1).execute([&] { one_thread = run(); });
  REQUIRE(bitwise_equal(a, b));
  REQUIRE(bitwise_equal(a, one_thread));
  REQUIRE(bitwise_equal(a, serial));
}

// ================================================================ rotary

namespace {
// Double-precision RoPE on [B, H, T, D].
std::vector<double> rotary_ref(const Vec& x, int64_t BH, int64_t T, int64_t D, int64_t off,
                               double base, bool inverse) {
  std::vector<double> y(x.size());
  const int64_t h = D / 2;
  for (int64_t r = 0; r < BH * T; ++r) {
    const double p = double(off + r % T);
    for (int64_t i = 0; i < h; ++i) {
      const double a = (inverse ? -1 : 1) * p * std::pow(base, -2.0 * double(i) / double(D));
      const double x1 = x[r * D + i], x2 = x[r * D + i + h];
      y[r * D + i] = x1 * std::cos(a) - x2 * std::sin(a);
      y[r * D + i + h] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  }
  return y;
}
}  // namespace

TEST_CASE("rotary_apply matches a double reference", "[rotary]") {
  const int64_t B = 2, H = 3, T = 17, D = 16;
  const Vec x = randn(B * H * T * D, 21);
  for (int64_t off : {0, 5, 100000}) {  // large offsets need double angles
    for (bool inv : {false, true}) {
      Vec y(x.size());
      rotary_apply(x.data(), y.data(), B, H, T, D, off, 10000.f, inv);
      REQUIRE(rel_err(y, rotary_ref(x, B * H, T, D, off, 10000.0, inv)) < 2e-6);
    }
  }
}

TEST_CASE("rotary golden value, hand computed", "[rotary]") {
  // D = 4, base 10000: theta = {1, 10000^(-1/2) = 0.01}; token t = 2 with
  // pos_offset 1 is position 3, so angles are 3 and 0.03 rad. Pairs (x0, x2)
  // = (1, 3) and (x1, x3) = (2, 4); cos 3 = -0.98999250, sin 3 = 0.14112001,
  // cos 0.03 = 0.99955003, sin 0.03 = 0.02999550.
  Vec x(3 * 4, 0.f);
  const float row[4] = {1, 2, 3, 4};
  std::memcpy(&x[2 * 4], row, sizeof(row));
  Vec y(x.size());
  rotary_apply(x.data(), y.data(), 1, 1, 3, 4, 1, 10000.f, false);
  CHECK(y[8] == Approx(1 * -0.98999250 - 3 * 0.14112001).epsilon(1e-6));   // -1.41335252
  CHECK(y[9] == Approx(2 * 0.99955003 - 4 * 0.02999550).epsilon(1e-6));    // 1.87911806
  CHECK(y[10] == Approx(3 * -0.98999250 + 1 * 0.14112001).epsilon(1e-6));  // -2.82885748
  CHECK(y[11] == Approx(4 * 0.99955003 + 2 * 0.02999550).epsilon(1e-6));   // 4.05819114
  CHECK(y[8] == Approx(-1.41335252).epsilon(1e-6));
}

TEST_CASE("rotary: inverse undoes apply, norm preserved, in place", "[rotary]") {
  const int64_t B = 3, H = 4, T = 33, D = 64;
  const Vec x = randn(B * H * T * D, 22);
  Vec y(x.size());
  rotary_apply(x.data(), y.data(), B, H, T, D, 7, 10000.f, false);
  // Each (i, i + D/2) pair is rotated, so its norm is preserved.
  for (int64_t r = 0; r < B * H * T; ++r) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const float* xr = &x[r * D];
      const float* yr = &y[r * D];
      REQUIRE(std::hypot(yr[i], yr[i + D / 2]) ==
              Approx(std::hypot(xr[i], xr[i + D / 2])).epsilon(1e-5).margin(1e-6));
    }
  }
  Vec z = y;  // in place: y aliases x
  rotary_apply(z.data(), z.data(), B, H, T, D, 7, 10000.f, true);
  REQUIRE(rel_err(z, x) < 1e-6);
  Vec w = x;
  rotary_apply(w.data(), w.data(), B, H, T, D, 7, 10000.f, false);
  REQUIRE(bitwise_equal(w, y));
}

TEST_CASE("rotary gradient is the inverse rotation", "[rotary]") {
  const int64_t B = 1, H = 2, T = 5, D = 8;
  Vec x = randn(B * H * T * D, 23);
  const Vec r = randn(x.size(), 24);
  auto loss = [&] {
    Vec y(x.size());
    rotary_apply(x.data(), y.data(), B, H, T, D, 3, 500.f, false);
    return dot(y, r);
  };
  const auto fd = finite_diff(x, 1e-2f, loss);
  Vec grad(x.size());
  rotary_apply(r.data(), grad.data(), B, H, T, D, 3, 500.f, true);
  REQUIRE(rel_err(grad, fd) < 1e-3);
}

TEST_CASE("rotary rejects odd head dims", "[rotary]") {
  Vec x(6);
  REQUIRE_THROWS_AS(rotary_apply(x.data(), x.data(), 1, 1, 2, 3, 0, 10000.f, false), redco::Error);
}

// ============================================================ conv2d

namespace {

std::vector<Conv2dGeometry> conv_cases() {
  std::vector<Conv2dGeometry> cs;
  cs.push_back({2, 3, 7, 5, 4, 3, 3, 1, 1});  // same padding, non-square
  cs.push_back({2, 3, 7, 5, 4, 3, 3, 2, 1});  // stride 2, pad 1
  cs.push_back({3, 2, 9, 6, 3, 2, 3, 2, 0});  // non-square kernel, no pad
  cs.push_back({1, 1, 4, 4, 2, 4, 4, 1, 0});  // kernel covers the image
  cs.push_back({2, 2, 5, 8, 3, 3, 2, 3, 2});  // stride 3, pad 2
  return cs;
}

// x [N, C, H, W] at (n, c, ih, iw), or 0 in the padding.
double at(const Vec& x, const Conv2dGeometry& g, int64_t n, int64_t c, int64_t ih, int64_t iw) {
  if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) return 0;
  return x[((n * g.C + c) * g.H + ih) * g.W + iw];
}

std::vector<double> conv_ref(const Vec& x, const Vec& w, const float* bias,
                             const Conv2dGeometry& g) {
  const int64_t OH = g.out_h(), OW = g.out_w();
  std::vector<double> y(g.N * g.O * OH * OW);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = bias ? bias[o] : 0.0;
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t kh = 0; kh < g.KH; ++kh)
              for (int64_t kw = 0; kw < g.KW; ++kw)
                s += at(x, g, n, c, oh * g.stride - g.pad + kh, ow * g.stride - g.pad + kw) *
                     w[((o * g.C + c) * g.KH + kh) * g.KW + kw];
          y[((n * g.O + o) * OH + oh) * OW + ow] = s;
        }
  return y;
}

int64_t cols_size(const Conv2dGeometry& g) {
  return g.N * g.C * g.KH * g.KW * g.out_h() * g.out_w();
}

}  // namespace

TEST_CASE("im2col matches a naive gather", "[conv]") {
  for (const auto& g : conv_cases()) {
    const Vec x = randn(g.N * g.C * g.H * g.W, 31);
    Vec cols(cols_size(g), -7.f);
    im2col(x.data(), cols.data(), g);
    const int64_t OH = g.out_h(), OW = g.out_w();
    std::vector<double> ref(cols.size());
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t kh = 0; kh < g.KH; ++kh)
          for (int64_t kw = 0; kw < g.KW; ++kw)
            for (int64_t oh = 0; oh < OH; ++oh)
              for (int64_t ow = 0; ow < OW; ++ow)
                ref[((((n * g.C + c) * g.KH + kh) * g.KW + kw) * OH + oh) * OW + ow] =
                    at(x, g, n, c, oh * g.stride - g.pad + kh, ow * g.stride - g.pad + kw);
    REQUIRE(rel_err(cols, ref) == 0);
  }
}

TEST_CASE("col2im is the adjoint of im2col", "[conv]") {
  for (const auto& g : conv_cases()) {
    const Vec x = randn(g.N * g.C * g.H * g.W, 32);
    const Vec c = randn(cols_size(g), 33);
    Vec cols(c.size()), dx(x.size(), 123.f);  // dx is overwritten
    im2col(x.data(), cols.data(), g);
    col2im(c.data(), dx.data(), g);
    const double lhs = dot(cols, c), rhs = dot(x, dx);
    REQUIRE(lhs == Approx(rhs).epsilon(1e-5));
  }
}

TEST_CASE("conv2d_forward matches a double reference", "[conv]") {
  auto cases = conv_cases();
  cases.push_back({16, 8, 14, 12, 16, 3, 3, 1, 1});  // enough images to go parallel
  for (const auto& g : cases) {
    const Vec x = randn(g.N * g.C * g.H * g.W, 34);
    const Vec w = randn(g.O * g.C * g.KH * g.KW, 35, 0.3f);
    const Vec b = randn(g.O, 36);
    Vec y(g.N * g.O * g.out_h() * g.out_w(), NAN), cols(cols_size(g));
    conv2d_forward(x.data(), w.data(), b.data(), y.data(), cols.data(), g);
    REQUIRE(rel_err(y, conv_ref(x, w, b.data(), g)) < 1e-5);
    std::fill(y.begin(), y.end(), NAN);
    conv2d_forward(x.data(), w.data(), nullptr, y.data(), cols.data(), g);
    REQUIRE(rel_err(y, conv_ref(x, w, nullptr, g)) < 1e-5);
  }
}

TEST_CASE("conv2d_backward matches finite differences", "[conv]") {
  for (const auto& g : conv_cases()) {
    Vec x = randn(g.N * g.C * g.H * g.W, 41);
    Vec w = randn(g.O * g.C * g.KH * g.KW, 42, 0.3f);
    Vec b = randn(g.O, 43);
    const Vec dy = randn(g.N * g.O * g.out_h() * g.out_w(), 44);
    Vec cols(cols_size(g));
    auto loss = [&] {  // <conv(x, w) + b, dy>
      Vec y(dy.size());
      conv2d_forward(x.data(), w.data(), b.data(), y.data(), cols.data(), g);
      return dot(y, dy);
    };
    // The loss is linear in each argument, so a large step has no truncation
    // error and keeps float rounding in the loss small relative to it.
    const auto fx = finite_diff(x, 0.5f, loss), fw = finite_diff(w, 0.5f, loss),
               fb = finite_diff(b, 0.5f, loss);
    Vec dx(x.size(), NAN), dw(w.size(), NAN), db(g.O, NAN);
    conv2d_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), cols.data(), g);
    CHECK(rel_err(dx, fx) < 1e-4);
    CHECK(rel_err(dw, fw) < 1e-4);
    CHECK(rel_err(db, fb) < 1e-4);
    // dx and dbias are optional.
    Vec dw2(w.size(), NAN);
    conv2d_backward(dy.data(), x.data(), w.data(), nullptr, dw2.data(), nullptr, cols.data(), g);
    CHECK(bitwise_equal(dw2, dw));
  }
}

TEST_CASE("conv2d_backward on a larger batch: reference and determinism", "[conv]") {
  const Conv2dGeometry g{40, 6, 12, 10, 8, 3, 3, 2, 1};
  const int64_t OH = g.out_h(), OW = g.out_w();
  const Vec x = randn(g.N * g.C * g.H * g.W, 51);
  const Vec w = randn(g.O * g.C * g.KH * g.KW, 52, 0.3f);
  const Vec dy = randn(g.N * g.O * OH * OW, 53);
  Vec cols(cols_size(g));
  auto run = [&](Vec& dx, Vec& dw, Vec& db) {
    dx.assign(x.size(), NAN), dw.assign(w.size(), NAN), db.assign(g.O, NAN);
    conv2d_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), cols.data(), g);
  };
  Vec dx, dw, db, dx1, dw1, db1;
  run(dx, dw, db);
  tbb::task_arena(1).execute([&] { run(dx1, dw1, db1); });
  REQUIRE(bitwise_equal(dx, dx1));
  REQUIRE(bitwise_equal(dw, dw1));
  REQUIRE(bitwise_equal(db, db1));
  // Direct double references.
  std::vector<double> rdx(x.size()), rdw(w.size()), rdb(g.O);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const double d = dy[((n * g.O + o) * OH + oh) * OW + ow];
          rdb[o] += d;
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t kh = 0; kh < g.KH; ++kh)
              for (int64_t kw = 0; kw < g.KW; ++kw) {
                const int64_t ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                const int64_t xi = ((n * g.C + c) * g.H + ih) * g.W + iw;
                const int64_t wi = ((o * g.C + c) * g.KH + kh) * g.KW + kw;
                rdw[wi] += d * x[xi];
                rdx[xi] += d * w[wi];
              }
        }
  CHECK(rel_err(dx, rdx) < 1e-5);
  CHECK(rel_err(dw, rdw) < 1e-5);
  CHECK(rel_err(db, rdb) < 1e-5);
}

TEST_CASE("conv2d rejects bad geometry", "[conv]") {
  Vec buf(1000);
  const Conv2dGeometry too_big{1, 1, 3, 3, 1, 5, 5, 1, 0};
  REQUIRE_THROWS_AS(
      conv2d_forward(buf.data(), buf.data(), nullptr, buf.data(), buf.data(), too_big),
      redco::Error);
  const Conv2dGeometry zero_stride{1, 1, 3, 3, 1, 3, 3, 0, 0};
  REQUIRE_THROWS_AS(im2col(buf.data(), buf.data(), zero_stride), redco::Error);
}

// ============================================================== pooling

namespace {

std::vector<Pool2dGeometry> pool_cases() {
  return {{2, 3, 6, 6, 2, 2},   // the CNN sample's 2x2/2
          {1, 2, 7, 5, 3, 2},   // overlapping windows, non-square
          {2, 1, 5, 9, 2, 3},   // gaps between windows
          {1, 1, 4, 4, 4, 1}};  // global
}

// Distinct values spaced >= 0.01 apart, so a small FD step cannot change the argmax.
Vec distinct_values(size_t n, uint32_t seed) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.01f * float(i) - 0.005f * float(n);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

}  // namespace

TEST_CASE("max_pool2d forward and backward", "[pool]") {
  for (const auto& g : pool_cases()) {
    const int64_t OH = g.out_h(), OW = g.out_w(), P = g.N * g.C;
    Vec x = distinct_values(P * g.H * g.W, 61);
    Vec y(P * OH * OW);
    std::vector<int32_t> am(y.size(), -1);
    max_pool2d_forward(x.data(), y.data(), am.data(), g);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          float best = -INFINITY;
          int64_t bi = -1;
          for (int64_t kh = 0; kh < g.K; ++kh)
            for (int64_t kw = 0; kw < g.K; ++kw) {
              const int64_t i = (oh * g.stride + kh) * g.W + ow * g.stride + kw;
              if (x[p * g.H * g.W + i] > best) best = x[p * g.H * g.W + i], bi = i;
            }
          const int64_t o = (p * OH + oh) * OW + ow;
          REQUIRE(y[o] == best);
          REQUIRE(am[o] == bi);
        }
    const Vec dy = randn(y.size(), 62);
    auto loss = [&] {
      Vec yy(y.size());
      std::vector<int32_t> a(y.size());
      max_pool2d_forward(x.data(), yy.data(), a.data(), g);
      return dot(yy, dy);
    };
    const auto fd = finite_diff(x, 1e-3f, loss);
    Vec dx(x.size(), NAN);
    max_pool2d_backward(dy.data(), am.data(), dx.data(), g);
    REQUIRE(rel_err(dx, fd) < 1e-3);
  }
}

TEST_CASE("max_pool2d ties pick the first maximum; NaN propagates", "[pool]") {
  const Pool2dGeometry g{1, 1, 2, 4, 2, 2};
  const Vec x = {1, 5, 0, NAN,  //
                 5, 2, 3, 1};
  Vec y(2);
  std::vector<int32_t> am(2);
  max_pool2d_forward(x.data(), y.data(), am.data(), g);
  CHECK(y[0] == 5.f);
  CHECK(am[0] == 1);
  CHECK(std::isnan(y[1]));
  CHECK(am[1] == 3);
}

TEST_CASE("avg_pool2d forward and backward", "[pool]") {
  for (const auto& g : pool_cases()) {
    const int64_t OH = g.out_h(), OW = g.out_w(), P = g.N * g.C;
    Vec x = randn(P * g.H * g.W, 71);
    Vec y(P * OH * OW);
    avg_pool2d_forward(x.data(), y.data(), g);
    std::vector<double> ref(y.size());
    for (int64_t p = 0; p < P; ++p)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = 0;
          for (int64_t kh = 0; kh < g.K; ++kh)
            for (int64_t kw = 0; kw < g.K; ++kw)
              s += x[(p * g.H + oh * g.stride + kh) * g.W + ow * g.stride + kw];
          ref[(p * OH + oh) * OW + ow] = s / double(g.K * g.K);
        }
    REQUIRE(rel_err(y, ref) < 1e-6);
    const Vec dy = randn(y.size(), 72);
    auto loss = [&] {
      Vec yy(y.size());
      avg_pool2d_forward(x.data(), yy.data(), g);
      return dot(yy, dy);
    };
    const auto fd = finite_diff(x, 0.5f, loss);
    Vec dx(x.size(), NAN);
    avg_pool2d_backward(dy.data(), dx.data(), g);
    REQUIRE(rel_err(dx, fd) < 1e-4);
  }
}

TEST_CASE("pooling on a CNN-sized batch uses the parallel path correctly", "[pool]") {
  const Pool2dGeometry g{128, 32, 28, 28, 2, 2};
  const Vec x = randn(g.N * g.C * g.H * g.W, 81);
  Vec y(g.N * g.C * 14 * 14), y_avg(y.size()), dx(x.size(), NAN);
  std::vector<int32_t> am(y.size());
  max_pool2d_forward(x.data(), y.data(), am.data(), g);
  avg_pool2d_forward(x.data(), y_avg.data(), g);
  // Spot-check each plane's first output against its window.
  for (int64_t p = 0; p < g.N * g.C; ++p) {
    const float* w = &x[p * 28 * 28];
    REQUIRE(y[p * 196] == std::max({w[0], w[1], w[28], w[29]}));
    REQUIRE(y_avg[p * 196] == Approx((w[0] + w[1] + w[28] + w[29]) / 4.0));
  }
  // Non-overlapping windows: backward of dy = y routes each max to its place.
  max_pool2d_backward(y.data(), am.data(), dx.data(), g);
  double sx = 0, sy = 0;
  for (float v : dx) sx += v;
  for (float v : y) sy += v;
  REQUIRE(sx == Approx(sy).epsilon(1e-6));
}

TEST_CASE("pooling rejects a window larger than the image", "[pool]") {
  Vec buf(100);
  std::vector<int32_t> am(100);
  const Pool2dGeometry g{1, 1, 3, 5, 4, 1};
  REQUIRE_THROWS_AS(max_pool2d_forward(buf.data(), buf.data(), am.data(), g), redco::Error);
  REQUIRE_THROWS_AS(avg_pool2d_forward(buf.data(), buf.data(), g), redco::Error);
}
