// The generic CPU kernels (redco::cpu, tensor_ops.hpp) against naive
// index-by-index references on random data. Shapes are chosen to hit every
// fast path (same shape, scalar, row broadcast, batched transpose, folded
// linear GEMM) and the general paths behind them, at sizes both below and
// above the threading grain.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "redco/ops/cpu/gemm.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"
#include "redco/ops/meta.hpp"

namespace redco {
namespace {

using Index = std::vector<int64_t>;

Tensor rnd(const Shape& s, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  return Tensor::uniform(s, seed, 7, lo, hi);
}

// Values on a grid of quarters in [0.5, 2]: many exact ties, for eq/gt/max/min.
Tensor grid(const Shape& s, uint64_t seed) {
  Tensor t = rnd(s, seed, 0.5f, 2.f);
  for (float& v : std::span(t.data<float>(), size_t(t.numel()))) v = std::round(v * 4.f) / 4.f;
  return t;
}

Index unravel(int64_t flat, const Shape& s) {
  Index idx(size_t(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[size_t(d)] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

// Flat index into x of the element that broadcasts to output index `idx`.
int64_t ravel_broadcast(const Index& idx, const Shape& x) {
  const int lead = int(idx.size()) - x.rank();
  int64_t flat = 0;
  for (int d = 0; d < x.rank(); ++d) flat = flat * x[d] + (x[d] == 1 ? 0 : idx[size_t(lead + d)]);
  return flat;
}

void check_close(const Tensor& got, const Shape& shape, const std::vector<float>& want,
                 float tol = 1e-5f) {
  REQUIRE(got.shape() == shape);
  REQUIRE(got.dtype() == DType::f32);
  const std::vector<float> g = got.to_vector();
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    // What Approx(want).epsilon(tol).margin(tol) accepts, without building an
    // assertion per element (a million of them under ASan took a minute);
    // anything else (a miss, NaN, infinities) goes to the assertion itself.
    if (std::abs(g[i] - want[i]) <= tol * std::max(1.f, std::abs(want[i]))) continue;
    INFO("element " << i << " of " << shape.str());
    REQUIRE(g[i] == Approx(want[i]).epsilon(tol).margin(tol));
  }
}

template <typename F>
void require_error(F&& f, std::vector<std::string> parts) {
  try {
    f();
    FAIL("expected redco::Error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) {
      INFO("message: " << msg << "\nexpected to contain: " << p);
      CHECK(msg.find(p) != std::string::npos);
    }
  }
}

float ref_unary(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::exp:
      return std::exp(x);
    case UnaryOp::log:
      return std::log(x);
    case UnaryOp::tanh:
      return std::tanh(x);
    case UnaryOp::sqrt:
      return std::sqrt(x);
    case UnaryOp::rsqrt:
      return 1.f / std::sqrt(x);
    case UnaryOp::sigmoid:
      return 1.f / (1.f + std::exp(-x));
    case UnaryOp::relu:
      return x > 0 ? x : 0.f;
    case UnaryOp::erf:
      return std::erf(x);
    case UnaryOp::abs:
      return std::fabs(x);
    case UnaryOp::square:
      return x * x;
    case UnaryOp::reciprocal:
      return 1.f / x;
    case UnaryOp::step:
      return x > 0 ? 1.f : 0.f;
  }
  return 0;
}

float ref_binary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::add:
      return a + b;
    case BinaryOp::sub:
      return a - b;
    case BinaryOp::mul:
      return a * b;
    case BinaryOp::div:
      return a / b;
    case BinaryOp::max:
      return std::max(a, b);
    case BinaryOp::min:
      return std::min(a, b);
    case BinaryOp::pow:
      return std::pow(a, b);
    case BinaryOp::eq:
      return a == b ? 1.f : 0.f;
    case BinaryOp::gt:
      return a > b ? 1.f : 0.f;
  }
  return 0;
}

const UnaryOp kUnary[] = {UnaryOp::neg,  UnaryOp::exp,   UnaryOp::log,     UnaryOp::tanh,
                          UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::sigmoid, UnaryOp::relu,
                          UnaryOp::erf,  UnaryOp::abs,   UnaryOp::square,  UnaryOp::reciprocal,
                          UnaryOp::step};
const BinaryOp kBinary[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul,
                            BinaryOp::div, BinaryOp::max, BinaryOp::min,
                            BinaryOp::pow, BinaryOp::eq,  BinaryOp::gt};

TEST_CASE("cpu unary ops match std:: functions", "[cpu][elementwise]") {
  for (const Shape& s : {Shape{}, Shape{7}, Shape{3, 5, 4}, Shape{200, 300}, Shape{0, 3}}) {
    for (UnaryOp op : kUnary) {
      const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt;
      const Tensor x = positive ? rnd(s, 1, 0.1f, 4.f) : rnd(s, 1, -3.f, 3.f);
      std::vector<float> want;
      for (float v : x.to_vector()) want.push_back(ref_unary(op, v));
      INFO("op " << int(op) << " shape " << s.str());
      check_close(cpu::unary(op, x), s, want);
    }
  }
}

TEST_CASE("cpu unary upcasts bf16 input to an f32 result", "[cpu][elementwise]") {
  const Tensor x = rnd({4, 9}, 2).to(DType::bf16);
  std::vector<float> want;
  for (float v : x.to_vector()) want.push_back(std::exp(v));  // from the rounded inputs
  check_close(cpu::unary(UnaryOp::exp, x), x.shape(), want);
}

std::vector<float> ref_broadcast_binary(BinaryOp op, const Tensor& a, const Tensor& b,
                                        const Shape& out) {
  const auto av = a.to_vector(), bv = b.to_vector();
  std::vector<float> want(size_t(out.numel()));
  for (int64_t i = 0; i < out.numel(); ++i) {
    const Index idx = unravel(i, out);
    want[size_t(i)] = ref_binary(op, av[size_t(ravel_broadcast(idx, a.shape()))],
                                 bv[size_t(ravel_broadcast(idx, b.shape()))]);
  }
  return want;
}

TEST_CASE("cpu binary ops broadcast like numpy", "[cpu][elementwise]") {
  struct Case {
    Shape a, b, out;
  };
  const Case cases[] = {
      {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}},            // same shape
      {{2, 3, 4}, {4}, {2, 3, 4}},                  // row broadcast
      {{4}, {2, 3, 4}, {2, 3, 4}},                  // row broadcast, on the left
      {{2, 3, 4}, {3, 1}, {2, 3, 4}},               // column broadcast
      {{2, 3, 4}, {2, 1, 4}, {2, 3, 4}},            // middle axis
      {{2, 1, 4}, {3, 1}, {2, 3, 4}},               // both sides broadcast
      {{2, 3, 4}, {}, {2, 3, 4}},                   // scalar
      {{}, {2, 3, 4}, {2, 3, 4}},                   // scalar on the left
      {{1, 1}, {3}, {1, 3}},                        // numel-1 tensor of higher rank
      {{3, 4}, {1, 3, 4}, {1, 3, 4}},               // same elements, extra leading 1
      {{0, 4}, {4}, {0, 4}},                        // empty
      {{2, 0, 4}, {2, 1, 4}, {2, 0, 4}},            // empty middle axis
      {{300, 400}, {300, 400}, {300, 400}},         // threaded flat loop
      {{64, 1024}, {1024}, {64, 1024}},             // threaded row loop
      {{64, 1, 700}, {1, 50, 700}, {64, 50, 700}},  // threaded general loop
  };
  for (const Case& c : cases) {
    const Tensor a = grid(c.a, 3), b = grid(c.b, 4);
    for (BinaryOp op : kBinary) {
      INFO("op " << int(op) << ": " << c.a.str() << " with " << c.b.str());
      check_close(cpu::binary(op, a, b), c.out, ref_broadcast_binary(op, a, b, c.out));
    }
  }
}

TEST_CASE("cpu binary comparisons give 1/0 and see exact ties", "[cpu][elementwise]") {
  const Tensor a = Tensor::from({1, 2, 3, 4}, {4});
  const Tensor b = Tensor::from({1, 3, 3, 0}, {4});
  CHECK(cpu::binary(BinaryOp::eq, a, b).to_vector() == std::vector<float>{1, 0, 1, 0});
  CHECK(cpu::binary(BinaryOp::gt, a, b).to_vector() == std::vector<float>{0, 0, 0, 1});
  CHECK(cpu::binary_scalar(BinaryOp::eq, a, 3.f).to_vector() == std::vector<float>{0, 0, 1, 0});
}

TEST_CASE("cpu binary rejects incompatible shapes naming both", "[cpu][elementwise]") {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  require_error([&] { meta::binary(BinaryOp::add, a, b); }, {"add", "[2, 3]", "[4]"});
  require_error([&] { meta::binary(BinaryOp::mul, b, a); }, {"mul", "[2, 3]", "[4]"});
}

TEST_CASE("cpu binary_scalar and add_inplace", "[cpu][elementwise]") {
  const Tensor a = grid({5, 33}, 5);
  for (BinaryOp op : kBinary) {
    std::vector<float> want;
    for (float v : a.to_vector()) want.push_back(ref_binary(op, v, 1.25f));
    check_close(cpu::binary_scalar(op, a, 1.25f), a.shape(), want);
  }
  Tensor acc = rnd({100, 700}, 6);
  const Tensor g = rnd({100, 700}, 7);
  std::vector<float> want = acc.to_vector();
  const auto gv = g.to_vector();
  for (size_t i = 0; i < want.size(); ++i) want[i] += gv[i];
  cpu::add_inplace(acc, g);
  check_close(acc, acc.shape(), want);

  Tensor self = Tensor::from({1, 2, 3}, {3});
  cpu::add_inplace(self, self);  // aliasing is allowed
  CHECK(self.to_vector() == std::vector<float>{2, 4, 6});

  Tensor half = Tensor::from({1, 2}, {2}).to(DType::bf16);
  cpu::add_inplace(half, Tensor::from({0.5f, 0.25f}, {2}));
  CHECK(half.dtype() == DType::bf16);
  CHECK(half.to_vector() == std::vector<float>{1.5f, 2.25f});

  Tensor small = Tensor::zeros({2, 3});
  require_error(
      [&] {
        meta::add_inplace(small, Tensor::zeros({3, 2}));
      },
      {"add_inplace", "[2, 3]", "[3, 2]"});
}

// Naive reduce over the axes in `mask` (bit d = axis d), keeping them as 1s.
std::vector<float> ref_reduce(ReduceOp op, const Tensor& x, unsigned mask, Shape* out) {
  Shape s = x.shape();
  for (int d = 0; d < s.rank(); ++d)
    if (mask >> d & 1u) s[d] = 1;
  *out = s;
  std::vector<double> acc(size_t(s.numel()), op == ReduceOp::sum ? 0.0 : -INFINITY);
  const auto xv = x.to_vector();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t o = size_t(ravel_broadcast(unravel(i, x.shape()), s));
    acc[o] = op == ReduceOp::sum ? acc[o] + xv[size_t(i)] : std::max<double>(acc[o], xv[size_t(i)]);
  }
  return std::vector<float>(acc.begin(), acc.end());
}

TEST_CASE("cpu reduce over every axis subset of a 3-D tensor", "[cpu][reduce]") {
  for (const Shape& s : {Shape{3, 4, 5}, Shape{40, 30, 50}, Shape{2, 0, 3}}) {
    const Tensor x = rnd(s, 8);
    for (unsigned mask = 0; mask < 8; ++mask) {
      std::vector<int> axes;
      for (int d = 0; d < 3; ++d)
        if (mask >> d & 1u) axes.push_back(d);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        Shape out;
        const auto want = ref_reduce(op, x, mask, &out);
        INFO("shape " << s.str() << " mask " << mask << " op " << int(op));
        check_close(cpu::reduce(op, x, axes), out, want, 1e-5f);
      }
    }
  }
}

TEST_CASE("cpu reduce sums long rows and columns accurately", "[cpu][reduce]") {
  // A float accumulator drifts by ~1e-4 relative over 2^22 terms; the kernel
  // must stay within a few float ulps of the double sum.
  const int64_t n = int64_t(1) << 22;
  const Tensor row = rnd({n}, 9, 0.f, 1.f);
  double want = 0;
  for (float v : row.to_vector()) want += v;
  const int axes0[] = {0};
  CHECK(cpu::reduce(ReduceOp::sum, row, axes0).item() == Approx(want).epsilon(1e-6));

  const Tensor cols = rnd({n / 64, 64}, 10, 0.f, 1.f);  // leading-axis path
  const auto cv = cols.to_vector();
  const auto got = cpu::reduce(ReduceOp::sum, cols, axes0).to_vector();
  for (int64_t j = 0; j < 64; ++j) {
    double w = 0;
    for (int64_t i = 0; i < n / 64; ++i) w += cv[size_t(i * 64 + j)];
    CHECK(got[size_t(j)] == Approx(w).epsilon(1e-6));
  }
}

TEST_CASE("cpu reduce of bf16 input is computed in f32", "[cpu][reduce]") {
  const Tensor x = Tensor::from({1, 2, 3, 4, 5, 6}, {2, 3}).to(DType::bf16);
  const int axes[] = {1};
  const Tensor y = cpu::reduce(ReduceOp::sum, x, axes);
  CHECK(y.dtype() == DType::f32);
  CHECK(y.shape() == Shape{2, 1});
  CHECK(y.to_vector() == std::vector<float>{6, 15});
}

TEST_CASE("cpu argmax takes the first of tied maxima", "[cpu][reduce]") {
  const Tensor x = Tensor::from({1, 3, 3, 5, 5, 2}, {2, 3});
  const Tensor a1 = cpu::argmax(x, 1);
  CHECK(a1.dtype() == DType::i64);
  CHECK(a1.shape() == Shape{2});
  CHECK(a1.values<int64_t>() == std::vector<int64_t>{1, 0});
  const Tensor t = Tensor::from({1, 5, 7, 1, 5, 7}, {2, 3});
  CHECK(cpu::argmax(t, 0).values<int64_t>() == std::vector<int64_t>{0, 0, 0});
  CHECK(cpu::argmax(t, -1).values<int64_t>() == std::vector<int64_t>{2, 2});
}

TEST_CASE("cpu argmax along each axis matches a scan", "[cpu][reduce]") {
  const Tensor x = grid({6, 7, 8}, 11);  // grid values: plenty of ties
  const auto xv = x.to_vector();
  for (int axis = 0; axis < 3; ++axis) {
    const Shape out = x.shape().drop(axis);
    const auto got = cpu::argmax(x, axis).values<int64_t>();
    for (int64_t o = 0; o < out.numel(); ++o) {
      Index idx = unravel(o, out);
      idx.insert(idx.begin() + axis, 0);
      int64_t best = 0;
      float best_v = -INFINITY;
      for (int64_t r = 0; r < x.dim(axis); ++r) {
        idx[size_t(axis)] = r;
        const float v = xv[size_t(ravel_broadcast(idx, x.shape()))];
        if (v > best_v) best_v = v, best = r;
      }
      CHECK(got[size_t(o)] == best);
    }
  }
}

// The u8 view of any tensor's bytes, to compare layouts of every dtype exactly.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

std::vector<float> ref_permute(const Tensor& x, const std::vector<int>& perm, Shape* out) {
  Shape s = x.shape();
  for (size_t i = 0; i < perm.size(); ++i) s[int(i)] = x.dim(perm[i]);
  *out = s;
  const auto xv = x.to_vector();
  std::vector<float> want(size_t(s.numel()));
  for (int64_t i = 0; i < s.numel(); ++i) {
    const Index oi = unravel(i, s);
    Index xi(perm.size());
    for (size_t d = 0; d < perm.size(); ++d) xi[size_t(perm[d])] = oi[d];
    want[size_t(i)] = xv[size_t(ravel_broadcast(xi, x.shape()))];
  }
  return want;
}

TEST_CASE("cpu permute: every permutation of a 4-D tensor, several dtypes", "[cpu][layout]") {
  const Tensor x = Tensor::arange(2 * 3 * 4 * 5).view({2, 3, 4, 5});
  std::vector<int> perm = {0, 1, 2, 3};
  do {
    Shape out;
    const auto want = ref_permute(x, perm, &out);
    INFO("perm " << perm[0] << perm[1] << perm[2] << perm[3]);
    check_close(cpu::permute(x, perm), out, want, 0.f);
    for (DType t : {DType::bf16, DType::i64, DType::u8, DType::i32}) {
      const Tensor xt = x.to(t);
      const Tensor got = cpu::permute(xt, perm);
      CHECK(got.dtype() == t);
      CHECK(bytes_of(got) == bytes_of(Tensor::from<float>(want, out).to(t)));
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
}

TEST_CASE("cpu permute: tiled transposes with ragged edges", "[cpu][layout]") {
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{67, 45}, {1, 0}},           {{3, 100, 70}, {0, 2, 1}}, {{2, 3, 33, 65}, {0, 1, 3, 2}},
      {{4, 5, 6, 7}, {2, 3, 0, 1}}, {{300, 257}, {1, 0}},      {{8, 16, 64}, {1, 0, 2}}};
  for (const auto& [s, perm] : cases) {
    const Tensor x = rnd(s, 12);
    Shape out;
    const auto want = ref_permute(x, perm, &out);
    check_close(cpu::permute(x, perm), out, want, 0.f);
  }
  require_error(
      [] {
        meta::permute(Tensor::zeros({2, 3}), std::vector<int>{0, 0});
      },
      {"permute", "[2, 3]"});
}

TEST_CASE("cpu broadcast_to copies along broadcast axes", "[cpu][layout]") {
  for (const auto& [src, dst] : std::vector<std::pair<Shape, Shape>>{{{3, 1}, {2, 3, 4}},
                                                                     {{4}, {2, 3, 4}},
                                                                     {{}, {2, 2}},
                                                                     {{2, 1, 4}, {2, 3, 4}},
                                                                     {{1, 5}, {0, 5}},
                                                                     {{2, 3}, {2, 3}}}) {
    const Tensor x = rnd(src, 13);
    const auto xv = x.to_vector();
    std::vector<float> want(size_t(dst.numel()));
    for (int64_t i = 0; i < dst.numel(); ++i)
      want[size_t(i)] = xv[size_t(ravel_broadcast(unravel(i, dst), src))];
    check_close(cpu::broadcast_to(x, dst), dst, want, 0.f);
    const Tensor xi = x.to(DType::i32);
    CHECK(cpu::broadcast_to(xi, dst).values<int32_t>() ==
          Tensor::from<float>(want, dst).to(DType::i32).values<int32_t>());
  }
  require_error(
      [] {
        meta::broadcast_to(Tensor::zeros({3, 2}), {3, 4});
      },
      {"broadcast_to", "[3, 2]", "[3, 4]"});
}

TEST_CASE("cpu slice and slice_assign round trip along every axis", "[cpu][layout]") {
  const Tensor x = rnd({4, 6, 5}, 14);
  const auto xv = x.to_vector();
  for (int axis = 0; axis < 3; ++axis) {
    const int64_t n = x.dim(axis);
    Tensor rebuilt = Tensor::zeros(x.shape());
    // Uneven pieces, including an empty one, cover the axis exactly once.
    const std::vector<int64_t> cuts = {0, 1, 1, n / 2 + 1, n};
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int64_t start = cuts[c], len = cuts[c + 1] - cuts[c];
      const Tensor piece = cpu::slice(x, axis, start, len);
      Shape ps = x.shape().with(axis, len);
      std::vector<float> want(size_t(ps.numel()));
      for (int64_t i = 0; i < ps.numel(); ++i) {
        Index idx = unravel(i, ps);
        idx[size_t(axis)] += start;
        want[size_t(i)] = xv[size_t(ravel_broadcast(idx, x.shape()))];
      }
      check_close(piece, ps, want, 0.f);
      cpu::slice_assign(rebuilt, piece, axis, start);
    }
    CHECK(rebuilt.to_vector() == xv);
  }
  const Tensor ids = Tensor::arange(12, DType::i64).view({3, 4});
  CHECK(cpu::slice(ids, 1, 1, 2).values<int64_t>() == std::vector<int64_t>{1, 2, 5, 6, 9, 10});
  Tensor dst = Tensor::zeros({3, 4});
  require_error(
      [&] {
        meta::slice_assign(dst, Tensor::zeros({2, 4}), 1, 0);
      },
      {"slice_assign", "[2, 4]", "[3, 4]"});
  require_error(
      [&] {
        meta::slice_assign(dst, Tensor::zeros({3, 2}), 1, 3);
      },
      {"slice_assign", "[3, 2]", "[3, 4]"});
  require_error([&] { meta::slice(dst, 0, 2, 2); }, {"slice", "[3, 4]"});
}

// Naive batched matmul with numpy batch broadcasting, in double.
std::vector<float> ref_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, Shape* out) {
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  const int64_t M = ta ? as[-1] : as[-2], K = ta ? as[-2] : as[-1];
  const int64_t N = tb ? bs[-2] : bs[-1];
  const int r = std::max(as.rank(), bs.rank());
  Index od(static_cast<size_t>(r));
  for (int i = 0; i < r - 2; ++i) {
    const int ia = as.rank() - r + i, ib = bs.rank() - r + i;
    od[size_t(i)] = std::max(ia >= 0 ? as[ia] : 1, ib >= 0 ? bs[ib] : 1);
  }
  od[size_t(r - 2)] = M;
  od[size_t(r - 1)] = N;
  *out = Shape(std::span<const int64_t>(od));
  const auto av = a.to_vector(), bv = b.to_vector();
  std::vector<float> want(size_t(out->numel()));
  for (int64_t i = 0; i < out->numel(); ++i) {
    Index ai = unravel(i, *out), bi = ai;
    const int64_t m = ai[size_t(r - 2)], n = ai[size_t(r - 1)];
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      ai[size_t(r - 2)] = ta ? k : m;
      ai[size_t(r - 1)] = ta ? m : k;
      bi[size_t(r - 2)] = tb ? n : k;
      bi[size_t(r - 1)] = tb ? k : n;
      s += double(av[size_t(ravel_broadcast(ai, as))]) * bv[size_t(ravel_broadcast(bi, bs))];
    }
    want[size_t(i)] = float(s);
  }
  return want;
}

// Stored shape of an operand whose op() is [batch..., rows, cols].
Shape stored(Index batch, int64_t rows, int64_t cols, bool trans) {
  batch.push_back(trans ? cols : rows);
  batch.push_back(trans ? rows : cols);
  return Shape(std::span<const int64_t>(batch));
}

TEST_CASE("cpu matmul: transpose flags and broadcast batch dims", "[cpu][matmul]") {
  struct Case {
    Index ba, bb;
    int64_t M, K, N;
  };
  const Case cases[] = {
      {{}, {}, 5, 7, 3},         {{2, 3}, {}, 5, 7, 4},         // linear fold path
      {{2}, {2}, 5, 7, 4},       {{}, {3}, 5, 7, 4},            // shared a
      {{2, 1}, {1, 3}, 5, 7, 4}, {{4, 2}, {2}, 3, 6, 5},        // mixed broadcast
      {{3}, {1}, 4, 8, 2},       {{2, 3}, {2, 3}, 33, 65, 17},  // larger, ragged
      {{2}, {}, 0, 3, 4},        {{2}, {2}, 3, 0, 4},           // empty M, empty K
  };
  for (const Case& c : cases) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      const Tensor a = rnd(stored(c.ba, c.M, c.K, ta), 15);
      const Tensor b = rnd(stored(c.bb, c.K, c.N, tb), 16);
      Shape out;
      const auto want = ref_matmul(a, b, ta, tb, &out);
      INFO(a.shape().str() << " x " << b.shape().str() << " ta=" << ta << " tb=" << tb);
      check_close(cpu::matmul(a, b, ta, tb), out, want, 1e-4f);
    }
  }
}

TEST_CASE("matmul_into writes or accumulates into a row range of a larger buffer",
          "[cpu][matmul]") {
  for (int flags = 0; flags < 4; ++flags) {
    const bool ta = flags & 1, tb = flags & 2;
    INFO("ta=" << ta << " tb=" << tb);
    const Tensor a = rnd(stored({}, 5, 7, ta), 17), b = rnd(stored({}, 7, 3, tb), 18);
    Shape out;
    const auto want = ref_matmul(a, b, ta, tb, &out);  // [5, 3]
    Tensor big = Tensor::full({9, 3}, 2.f);
    Tensor rows = big.slice0(2, 7);
    cpu::matmul_into(a, b, ta, tb, rows, false);
    check_close(rows, out, want, 1e-4f);
    cpu::matmul_into(a, b, ta, tb, rows, true);  // now twice the product
    std::vector<float> twice(want);
    for (float& v : twice) v *= 2.f;
    check_close(rows, out, twice, 1e-4f);
    const auto all = big.to_vector();  // rows outside [2, 7) untouched
    for (size_t i : {size_t(0), size_t(5), size_t(21), size_t(26)}) CHECK(all[i] == 2.f);
  }
  Tensor wrong = Tensor::zeros({5, 4});
  require_error(
      [&] {
        meta::matmul_into(rnd({5, 7}, 1), rnd({7, 3}, 2), false, false, wrong, false);
      },
      {"matmul_into", "[5, 4]"});
}

TEST_CASE("cpu matmul errors name both shapes", "[cpu][matmul]") {
  const Tensor a = Tensor::zeros({2, 5, 7}), b = Tensor::zeros({6, 3});
  require_error([&] { meta::matmul(a, b, false, false); }, {"matmul", "[2, 5, 7]", "[6, 3]"});
  require_error(
      [&] {
        meta::matmul(a, Tensor::zeros({3, 7, 2}), false, false);
      },
      {"matmul", "[2, 5, 7]", "[3, 7, 2]"});
  require_error([&] { meta::matmul(Tensor::zeros({7}), b, false, false); },
                {"matmul", "[7]", "[6, 3]"});
}

// x with every element rounded to bf16 (through the bf16 storage type).
Tensor bf16_rounded(const Tensor& x) { return x.to(DType::bf16).to(DType::f32); }

// One bf16 product checked against the reference on bf16-rounded operands.
void check_bf16_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  INFO(a.shape().str() << " x " << b.shape().str() << " ta=" << ta << " tb=" << tb);
  Shape out;
  const auto exact = ref_matmul(a, b, ta, tb, &out);
  const auto want = ref_matmul(bf16_rounded(a), bf16_rounded(b), ta, tb, &out);
  Tensor got;
  {
    PrecisionGuard mixed(Precision::bf16);
    got = cpu::matmul(a, b, ta, tb);
  }
  CHECK(matmul_precision() == Precision::f32);  // the guard restored the default
  // Products of bf16 values are exact in f32: only the f32 summation differs.
  check_close(got, out, want, 1e-4f);
  // ... and the result really is the bf16 one: it departs from the f32
  // product by about bf16's precision (|x| <= 1, K = 70 terms), no more.
  const auto g = got.to_vector();
  float worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - exact[i]));
  CHECK(worst > 1e-4f);
  CHECK(worst < 70 * 2 * 0.0039f);
}

// The bf16 GEMM paths this CPU can run: f32 GEMM on rounded operands always,
// oneDNN's bf16 GEMM where the CPU has bf16 instructions (oneDNN implements
// bf16 matmul nowhere else). Puts the automatic choice back when done.
struct Bf16Paths {
  std::vector<cpu::Bf16GemmPath> list{cpu::Bf16GemmPath::rounded};
  Bf16Paths() {
    if (cpu::has_native_bf16()) list.push_back(cpu::Bf16GemmPath::onednn);
  }
  ~Bf16Paths() { cpu::set_bf16_gemm_path(cpu::Bf16GemmPath::automatic); }
  // f(path, trans_a, trans_b) on every path, for the four transpose cases.
  template <typename F>
  void each(F&& f) const {
    for (const auto path : list) {
      cpu::set_bf16_gemm_path(path);
      for (int flags = 0; flags < 4; ++flags) f(path, bool(flags & 1), bool(flags & 2));
    }
  }
};

TEST_CASE("cpu matmul under bf16 precision rounds both operands and accumulates in f32",
          "[cpu][matmul][bf16]") {
  // Both ways of computing it (Bf16Paths).
  Bf16Paths().each([](cpu::Bf16GemmPath, bool ta, bool tb) {
    const Tensor b = rnd(stored({}, 70, 19, tb), 22);                // op(b): [70, 19]
    check_bf16_matmul(rnd(stored({}, 33, 70, ta), 21), b, ta, tb);   // a plain product
    check_bf16_matmul(rnd(stored({2}, 33, 70, ta), 23), b, ta, tb);  // batch dims
  });
}

TEST_CASE("matmul_into under bf16 precision writes and accumulates the bf16 product",
          "[cpu][matmul][bf16]") {
  // The LM head's chunked loss runs its dX and dW GEMMs through matmul_into;
  // where the CPU has bf16 dot products they are oneDNN bf16 GEMMs, the
  // accumulating one with a sum post-op.
  Bf16Paths().each([](cpu::Bf16GemmPath path, bool ta, bool tb) {
    INFO("onednn=" << (path == cpu::Bf16GemmPath::onednn) << " ta=" << ta << " tb=" << tb);
    const Tensor a = rnd(stored({}, 21, 70, ta), 41), b = rnd(stored({}, 70, 13, tb), 42);
    Shape out;
    const auto want = ref_matmul(bf16_rounded(a), bf16_rounded(b), ta, tb, &out);  // [21, 13]
    Tensor big = Tensor::full({25, 13}, 2.f);
    Tensor rows = big.slice0(3, 24);
    PrecisionGuard mixed(Precision::bf16);
    cpu::matmul_into(a, b, ta, tb, rows, false);
    check_close(rows, out, want, 1e-4f);
    cpu::matmul_into(a, b, ta, tb, rows, true);
    std::vector<float> twice(want);
    for (float& v : twice) v *= 2.f;
    check_close(rows, out, twice, 1e-4f);
    const auto all = big.to_vector();  // rows outside [3, 24) untouched
    for (size_t i : {size_t(0), size_t(38), size_t(24 * 13), size_t(25 * 13 - 1)})
      CHECK(all[i] == 2.f);
  });
}

TEST_CASE("cpu matmul rounding to bf16 keeps infinities and NaN", "[cpu][matmul][bf16]") {
  PrecisionGuard mixed(Precision::bf16);
  auto product = [](float x, float y) {  // a 1x1 by 1x1 product under bf16 precision
    return cpu::matmul(Tensor::from({x}, {1, 1}), Tensor::from({y}, {1, 1}), false, false).item();
  };
  CHECK(product(1.00001f, 1.f) == 1.f);          // 1.00001 rounds to 1 in bf16
  CHECK(product(1.f, 3.1415927f) == 3.140625f);  // pi to 8 significant bits
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(product(inf, 2.f) == inf);
  CHECK(product(-inf, 2.f) == -inf);
  CHECK(std::isnan(product(std::numeric_limits<float>::quiet_NaN(), 1.f)));
  CHECK(product(std::numeric_limits<float>::max(), 1.f) == inf);  // rounds up, as in bf16
}

TEST_CASE("cpu matmul: a transposed operand with a 1 KiB row stride", "[cpu][matmul]") {
  // op(a) = a^T with a stored [K, M] and M = 256 floats per row: the weight
  // gradient shape that takes the explicit-transpose path.
  const int64_t K = 512, M = 256, N = 129;
  const Tensor a = rnd({K, M}, 31), b = rnd({K, N}, 32);
  const auto av = a.to_vector(), bv = b.to_vector();
  std::vector<float> want(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(av[size_t(k * M + m)]) * bv[size_t(k * N + n)];
      want[size_t(m * N + n)] = float(s);
    }
  check_close(cpu::matmul(a, b, true, false), {M, N}, want, 1e-4f);
}

}  // namespace
}  // namespace redco
