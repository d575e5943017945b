// Fused attention (flash_attention_forward/backward) against a plain
// double-precision reference that materialises the T x T scores, over causal
// and full masks, Tq == Tk and Tq < Tk (decoding with a KV cache), grouped-query
// heads, sequence lengths that are not multiples of the 64-row tiles, and head
// dims 16 / 64. The reference's own backward is checked against central finite
// differences in double, and the kernel's backward against finite differences
// of the kernel's forward, so neither side is trusted on its own.
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/core/error.hpp"
#include "redco/ops/cpu/attention.hpp"

namespace {

using redco::cpu::AttentionShape;
using Vd = std::vector<double>;
using Vf = std::vector<float>;

Vf randn(int64_t n, uint64_t seed, float stddev = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  Vf v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

Vd to_d(const Vf& v) { return Vd(v.begin(), v.end()); }

AttentionShape make_shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D,
                          bool causal) {
  return AttentionShape{B, Hq, Hkv, Tq, Tk, D, 1.f / std::sqrt(static_cast<float>(D)), causal};
}

int64_t q_size(const AttentionShape& s) { return s.B * s.Hq * s.Tq * s.D; }
int64_t kv_size(const AttentionShape& s) { return s.B * s.Hkv * s.Tk * s.D; }

// Every |got - want| <= atol + rtol |want| (infinities must match exactly).
void check_close(const Vf& got, const Vd& want, double atol, double rtol, const char* what) {
  REQUIRE(got.size() == want.size());
  if (got.empty()) return;
  double worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double r = std::abs(got[i] - want[i]) / (atol + rtol * std::abs(want[i]));
    if (std::isinf(want[i])) r = got[i] == want[i] ? 0.0 : 1e30;
    if (!(r <= worst)) worst = r, wi = i;
  }
  INFO(what << ": worst at " << wi << " got " << got[wi] << " want " << want[wi]
            << " (ratio to tolerance " << worst << ")");
  CHECK(worst <= 1.0);
}

// Materialised attention in double: forward fills o, lse; backward (when
// dout != nullptr) fills dq, dk, dv. Rows that see no key: o = 0, lse = -inf.
struct Reference {
  Vd o, lse, dq, dk, dv;
};

Reference reference(const AttentionShape& s, const Vd& q, const Vd& k, const Vd& v,
                    const Vd* dout) {
  const int64_t D = s.D, group = s.Hq / s.Hkv, off = s.Tk - s.Tq;
  Reference r{Vd(q.size(), 0.0), Vd(s.B * s.Hq * s.Tq), Vd(q.size(), 0.0), Vd(k.size(), 0.0),
              Vd(v.size(), 0.0)};
  Vd p(s.Tk), dp(s.Tk);  // [Tk]: one row of probabilities and of dP
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t qb = (b * s.Hq + h) * s.Tq, kb = (b * s.Hkv + h / group) * s.Tk;
      for (int64_t i = 0; i < s.Tq; ++i) {
        const int64_t n = s.causal ? std::clamp<int64_t>(i + off + 1, 0, s.Tk) : s.Tk;
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[(qb + i) * D + d] * k[(kb + j) * D + d];
          p[j] = dot * s.scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = 0; j < n; ++j) sum += std::exp(p[j] - m);
        r.lse[qb + i] = n == 0 ? m : m + std::log(sum);
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp(p[j] - r.lse[qb + i]);
          for (int64_t d = 0; d < D; ++d) r.o[(qb + i) * D + d] += p[j] * v[(kb + j) * D + d];
        }
        if (dout == nullptr) continue;
        // dP = dO V^T; dS = P (dP - sum_j P dP); dq = scale dS K; dk += scale dS^T q; dv += P^T dO
        const double* g = dout->data() + (qb + i) * D;
        double pdp = 0;
        for (int64_t j = 0; j < n; ++j) {
          dp[j] = 0;
          for (int64_t d = 0; d < D; ++d) dp[j] += g[d] * v[(kb + j) * D + d];
          pdp += p[j] * dp[j];
        }
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * s.scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dq[(qb + i) * D + d] += ds * k[(kb + j) * D + d];
            r.dk[(kb + j) * D + d] += ds * q[(qb + i) * D + d];
            r.dv[(kb + j) * D + d] += p[j] * g[d];
          }
        }
      }
    }
  return r;
}

struct Kernel {
  Vf o, lse, dq, dk, dv;
};

Kernel run_kernel(const AttentionShape& s, const Vf& q, const Vf& k, const Vf& v, const Vf& dout) {
  Kernel r{Vf(q.size()), Vf(s.B * s.Hq * s.Tq), Vf(q.size()), Vf(k.size()), Vf(v.size())};
  redco::cpu::flash_attention_forward(s, q.data(), k.data(), v.data(), r.o.data(), r.lse.data());
  // Outputs are written, not accumulated: poison them to prove every entry is set.
  std::fill(r.dq.begin(), r.dq.end(), std::nanf(""));
  std::fill(r.dk.begin(), r.dk.end(), std::nanf(""));
  std::fill(r.dv.begin(), r.dv.end(), std::nanf(""));
  redco::cpu::flash_attention_backward(s, q.data(), k.data(), v.data(), r.o.data(), r.lse.data(),
                                       dout.data(), r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

// Forward and backward of one shape against the reference.
void check_against_reference(const AttentionShape& s, uint64_t seed, float input_std = 1.f) {
  INFO("B=" << s.B << " Hq=" << s.Hq << " Hkv=" << s.Hkv << " Tq=" << s.Tq << " Tk=" << s.Tk
            << " D=" << s.D << " causal=" << s.causal << " scale=" << s.scale);
  const Vf q = randn(q_size(s), seed, input_std), k = randn(kv_size(s), seed + 1, input_std);
  const Vf v = randn(kv_size(s), seed + 2), dout = randn(q_size(s), seed + 3);
  const Kernel got = run_kernel(s, q, k, v, dout);
  const Vd dout_d = to_d(dout);
  const Reference want = reference(s, to_d(q), to_d(k), to_d(v), &dout_d);
  check_close(got.o, want.o, 1e-5, 1e-4, "o");
  check_close(got.lse, want.lse, 1e-5, 1e-5, "lse");
  check_close(got.dq, want.dq, 1e-4, 1e-3, "dq");
  check_close(got.dk, want.dk, 1e-4, 1e-3, "dk");
  check_close(got.dv, want.dv, 1e-4, 1e-3, "dv");
}

// Central differences of loss() w.r.t. every entry of p (restored after).
template <typename T>
std::vector<double> fd_grad(std::vector<T>& p, const std::function<double()>& loss, T h) {
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const T x = p[i];
    p[i] = x + h;
    const double lp = loss();
    p[i] = x - h;
    const double lm = loss();
    p[i] = x;
    g[i] = (lp - lm) / (2.0 * static_cast<double>(h));
  }
  return g;
}

double dot(const Vd& a, const Vd& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double dot(const Vf& a, const Vf& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double{a[i]} * b[i];
  return s;
}

}  // namespace

TEST_CASE("attention forward/backward match the reference: Tq == Tk", "[attention]") {
  uint64_t seed = 100;
  for (const int64_t T : {1, 37, 64, 130})
    for (const int64_t D : {16, 64})
      for (const bool causal : {false, true})
        check_against_reference(make_shape(1, 2, 2, T, T, D, causal), seed += 10);
}

TEST_CASE("attention matches the reference: Tq < Tk (queries are the last positions)",
          "[attention]") {
  uint64_t seed = 200;
  const int64_t cases[][2] = {{1, 130}, {37, 130}, {5, 37}, {64, 129}, {130, 200}};
  for (const auto& c : cases)
    for (const bool causal : {false, true})
      check_against_reference(make_shape(2, 2, 1, c[0], c[1], 16, causal), seed += 10);
}

TEST_CASE("attention matches the reference: grouped-query heads", "[attention]") {
  uint64_t seed = 300;
  for (const int64_t Hkv : {4, 2, 1})
    for (const bool causal : {false, true}) {
      check_against_reference(make_shape(2, 4, Hkv, 130, 130, 16, causal), seed += 10);
      check_against_reference(make_shape(1, 4, Hkv, 37, 130, 64, causal), seed += 10);
    }
}

TEST_CASE("attention backward is right at every thread count", "[attention]") {
  // One thread: one task per (batch, kv head). Four: the single kv head's key
  // tiles are split into sets that each accumulate their own dq copy. The
  // global limit lets a 4-thread arena exist on a machine with fewer cores.
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 4);
  for (const int threads : {1, 4}) {
    INFO("threads=" << threads);
    tbb::task_arena arena(threads);
    arena.execute([&] {
      check_against_reference(make_shape(1, 4, 1, 200, 200, 16, true), 400 + threads);
      check_against_reference(make_shape(1, 2, 1, 70, 300, 64, false), 410 + threads);
    });
  }
}

TEST_CASE("attention is stable for large scores (online softmax rescaling)", "[attention]") {
  // Scores of several hundred: exp() overflows unless each running max is
  // subtracted, and the max keeps rising across key tiles.
  AttentionShape s = make_shape(1, 2, 1, 130, 130, 16, false);
  s.scale = 4.f;
  check_against_reference(s, 500, 2.f);
  s.causal = true;
  check_against_reference(s, 510, 2.f);
}

TEST_CASE("attention: causal queries that see no key give zero output and gradient",
          "[attention]") {
  // Tq > Tk: the first Tq - Tk queries precede every key; Tk == 0: none sees any.
  for (const int64_t Tk : {0, 20}) {
    const AttentionShape s = make_shape(1, 2, 1, 70, Tk, 16, Tk > 0);
    check_against_reference(s, 600 + Tk);
    const Vf q = randn(q_size(s), 1), k = randn(kv_size(s), 2), v = randn(kv_size(s), 3);
    const Kernel got = run_kernel(s, q, k, v, randn(q_size(s), 4));
    for (int64_t i = 0; i < s.Tq - Tk; ++i) {  // head 0, rows with no key
      CHECK(got.lse[i] == -std::numeric_limits<float>::infinity());
      for (int64_t d = 0; d < s.D; ++d) CHECK(got.o[i * s.D + d] == 0.f);
      for (int64_t d = 0; d < s.D; ++d) CHECK(got.dq[i * s.D + d] == 0.f);
    }
  }
}

TEST_CASE("attention reference backward matches finite differences (double)", "[attention]") {
  for (const bool causal : {false, true}) {
    const AttentionShape s = make_shape(1, 2, 1, 3, 5, 4, causal);
    Vd q = to_d(randn(q_size(s), 700)), k = to_d(randn(kv_size(s), 701));
    Vd v = to_d(randn(kv_size(s), 702));
    const Vd r = to_d(randn(q_size(s), 703));
    const Reference an = reference(s, q, k, v, &r);
    auto loss = [&] { return dot(reference(s, q, k, v, nullptr).o, r); };
    const Vd gq = fd_grad(q, loss, 1e-5), gk = fd_grad(k, loss, 1e-5), gv = fd_grad(v, loss, 1e-5);
    for (size_t i = 0; i < gq.size(); ++i) CHECK(an.dq[i] == Approx(gq[i]).margin(1e-8));
    for (size_t i = 0; i < gk.size(); ++i) CHECK(an.dk[i] == Approx(gk[i]).margin(1e-8));
    for (size_t i = 0; i < gv.size(); ++i) CHECK(an.dv[i] == Approx(gv[i]).margin(1e-8));
  }
}

TEST_CASE("attention kernel backward matches finite differences of its forward", "[attention]") {
  // Tq < Tk with GQA and causal masking on a tiny case; loss = sum(o * r).
  // Float forward: step 1e-2 balances truncation (h^2) against rounding (eps/h).
  const AttentionShape s = make_shape(1, 2, 1, 3, 5, 4, true);
  Vf q = randn(q_size(s), 800), k = randn(kv_size(s), 801), v = randn(kv_size(s), 802);
  const Vf r = randn(q_size(s), 803);
  const Kernel an = run_kernel(s, q, k, v, r);
  Vf o(q.size()), lse(s.B * s.Hq * s.Tq);
  auto loss = [&] {
    redco::cpu::flash_attention_forward(s, q.data(), k.data(), v.data(), o.data(), lse.data());
    return dot(o, r);
  };
  const Vd gq = fd_grad(q, loss, 1e-2f), gk = fd_grad(k, loss, 1e-2f), gv = fd_grad(v, loss, 1e-2f);
  check_close(an.dq, gq, 2e-3, 1e-2, "dq vs finite differences");
  check_close(an.dk, gk, 2e-3, 1e-2, "dk vs finite differences");
  check_close(an.dv, gv, 2e-3, 1e-2, "dv vs finite differences");
}

TEST_CASE("attention rejects inconsistent shapes", "[attention]") {
  Vf buf(64, 0.f);
  float* p = buf.data();
  const AttentionShape bad_heads = make_shape(1, 3, 2, 2, 2, 4, false);
  CHECK_THROWS_AS(redco::cpu::flash_attention_forward(bad_heads, p, p, p, p, p), redco::Error);
  const AttentionShape bad_dim = make_shape(1, 2, 1, 2, 2, 0, false);
  CHECK_THROWS_AS(redco::cpu::flash_attention_backward(bad_dim, p, p, p, p, p, p, p, p, p),
                  redco::Error);
}

// The decode kernel (a few query rows against a KV cache) against the tiled
// kernel, with everything a cache step passes: per-row key ranges and causal
// offsets, shared and per-row biases, grouped-query heads, head dims that are
// and are not multiples of 8, and a bf16 cache (against the tiled kernel on
// the same values widened to f32: only the order of the sums may differ).
TEST_CASE("decode attention equals the tiled kernel on cache steps", "[attention]") {
  using redco::cpu::decode_attention_forward;
  using redco::cpu::flash_attention_forward;
  uint64_t seed = 900;
  struct Case {
    int64_t B, Hq, Hkv, Tq, Tk, D;
    bool causal, ranges, bias, bias_per_row, bf16;
  };
  const Case cases[] = {
      {1, 12, 12, 1, 576, 64, true, true, false, false, false},
      {3, 4, 2, 1, 130, 16, true, true, false, false, true},
      {2, 8, 2, 3, 77, 20, true, true, false, false, false},
      {2, 4, 4, 1, 64, 64, false, true, true, false, false},
      {2, 4, 1, 2, 50, 16, true, true, true, true, true},
      {1, 2, 2, 4, 9, 8, false, false, false, false, true},
      {2, 6, 2, 1, 203, 72, true, true, false, false, true},
  };
  for (const Case& c : cases) {
    AttentionShape s = make_shape(c.B, c.Hq, c.Hkv, c.Tq, c.Tk, c.D, c.causal);
    INFO("B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " Tq " << c.Tq << " Tk " << c.Tk
              << " D " << c.D << " bf16 " << c.bf16);
    REQUIRE(redco::cpu::use_decode_attention(s));
    const Vf q = randn(q_size(s), seed++);
    Vf k = randn(kv_size(s), seed++), v = randn(kv_size(s), seed++);
    std::vector<uint16_t> kb(k.size()), vb(v.size());
    if (c.bf16)  // the cache's values: f32 rounded to bf16, and their bits
      for (size_t i = 0; i < k.size(); ++i) {
        kb[i] = redco::float_to_bf16(k[i]), k[i] = redco::bf16_to_float(kb[i]);
        vb[i] = redco::float_to_bf16(v[i]), v[i] = redco::bf16_to_float(vb[i]);
      }
    std::vector<int64_t> begin(size_t(c.B)), end(size_t(c.B)), offset(size_t(c.B));
    for (int64_t b = 0; b < c.B; ++b) {  // row b holds Tk - 7b tokens, the first b are padding
      begin[size_t(b)] = b;
      end[size_t(b)] = c.Tk - 7 * b;
      offset[size_t(b)] = end[size_t(b)] - c.Tq;
    }
    if (c.ranges)
      s.key_begin = begin.data(), s.key_end = end.data(), s.causal_offset = offset.data();
    const Vf bias = randn((c.bias_per_row ? c.B : 1) * c.Hq * c.Tq * c.Tk, seed++);
    if (c.bias) s.bias = bias.data(), s.bias_per_row = c.bias_per_row;
    Vf o_tiled(size_t(q_size(s))), lse_tiled(size_t(c.B * c.Hq * c.Tq));
    Vf o(o_tiled.size(), 7.f), lse(lse_tiled.size(), 7.f);
    flash_attention_forward(s, q.data(), k.data(), v.data(), o_tiled.data(), lse_tiled.data());
    if (c.bf16)
      decode_attention_forward(s, q.data(), kb.data(), vb.data(), true, o.data(), lse.data());
    else
      decode_attention_forward(s, q.data(), k.data(), v.data(), false, o.data(), lse.data());
    check_close(o, to_d(o_tiled), 1e-5, 1e-4, "o");
    check_close(lse, to_d(lse_tiled), 1e-5, 1e-5, "lse");
    if (c.bf16) {  // the bf16 cache sums exactly what its f32 widening sums, bit for bit
      Vf o32(o.size()), lse32(lse.size());
      decode_attention_forward(s, q.data(), k.data(), v.data(), false, o32.data(), lse32.data());
      for (size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == o32[i]);
      for (size_t i = 0; i < lse.size(); ++i) REQUIRE(lse[i] == lse32[i]);
    }
  }
}

// Batch invariance, bit for bit: a row decoded in a batch of rows with other
// key ranges equals the same row decoded alone (generation's batched output
// must equal one-by-one output, token for token).
TEST_CASE("decode attention: a row's output does not depend on its batch", "[attention]") {
  const int64_t B = 3, Hq = 4, Hkv = 2, Tk = 150, D = 72;
  AttentionShape s = make_shape(B, Hq, Hkv, 1, Tk, D, true);
  const Vf q = randn(q_size(s), 41), k = randn(kv_size(s), 42), v = randn(kv_size(s), 43);
  std::vector<int64_t> begin{0, 5, 11}, end{150, 131, 97}, offset{149, 130, 96};
  s.key_begin = begin.data(), s.key_end = end.data(), s.causal_offset = offset.data();
  Vf o(size_t(q_size(s))), lse(size_t(B * Hq));
  redco::cpu::decode_attention_forward(s, q.data(), k.data(), v.data(), false, o.data(),
                                       lse.data());
  for (int64_t b = 0; b < B; ++b) {
    AttentionShape one = make_shape(1, Hq, Hkv, 1, Tk, D, true);
    one.key_begin = &begin[size_t(b)], one.key_end = &end[size_t(b)];
    one.causal_offset = &offset[size_t(b)];
    const int64_t qn = Hq * D, kvn = Hkv * Tk * D;
    Vf o1(static_cast<size_t>(qn)), lse1(static_cast<size_t>(Hq));
    redco::cpu::decode_attention_forward(one, q.data() + b * qn, k.data() + b * kvn,
                                         v.data() + b * kvn, false, o1.data(), lse1.data());
    for (int64_t i = 0; i < qn; ++i) REQUIRE(o1[size_t(i)] == o[size_t(b * qn + i)]);
  }
}

// A paged KV cache (AttentionShape::block_table): the same keys and values
// scattered over a pool of blocks in shuffled order give the contiguous
// rows' outputs bit for bit, at block sizes below, at and above the kernel's
// 64-key chunks and ones that are not multiples of its 8-key groups.
TEST_CASE("decode attention reads a paged cache bit for bit as rows", "[attention]") {
  uint64_t seed = 1300;
  for (const int64_t block : {5, 8, 16, 64, 96})
    for (const bool bf16 : {false, true})
      for (const int64_t Tq : {1, 3}) {
        INFO("block " << block << " bf16 " << bf16 << " Tq " << Tq);
        const int64_t B = 3, Hq = 6, Hkv = 2, D = 24, M = (200 + block - 1) / block, Tk = M * block;
        AttentionShape s = make_shape(B, Hq, Hkv, Tq, Tk, D, true);
        std::vector<int64_t> begin{0, 0, 3}, end{Tk - 1, 77, 130}, offset(3);
        for (int64_t b = 0; b < B; ++b) offset[size_t(b)] = end[size_t(b)] - Tq;
        s.key_begin = begin.data(), s.key_end = end.data(), s.causal_offset = offset.data();
        const Vf q = randn(q_size(s), seed++);
        Vf k = randn(kv_size(s), seed++), v = randn(kv_size(s), seed++);
        // The pool: every row's blocks in a shuffled order, and spare ones.
        const int64_t N = B * M + 4;
        std::vector<int64_t> order(static_cast<size_t>(N));
        for (int64_t i = 0; i < N; ++i) order[size_t(i)] = i;
        std::shuffle(order.begin(), order.end(), std::mt19937_64(seed++));
        std::vector<int64_t> table(size_t(B * M), -1);
        Vf pk(size_t(N * Hkv * block * D), NAN), pv(pk.size(), NAN);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t m = 0; m * block < end[size_t(b)]; ++m) {  // blocks past a row's keys: none
            const int64_t n = table[size_t(b * M + m)] = order[size_t(b * M + m)];
            for (int64_t g = 0; g < Hkv; ++g)
              for (int64_t j = 0; j < block * D; ++j) {
                const size_t from = size_t(((b * Hkv + g) * Tk + m * block) * D + j);
                pk[size_t((n * Hkv + g) * block * D + j)] = k[from];
                pv[size_t((n * Hkv + g) * block * D + j)] = v[from];
              }
          }
        auto as_bf16 = [](const Vf& x) {
          std::vector<uint16_t> y(x.size());
          for (size_t i = 0; i < x.size(); ++i) y[i] = redco::float_to_bf16(x[i]);
          return y;
        };
        Vf o(size_t(q_size(s))), lse(size_t(B * Hq * Tq)), po(o.size(), 7.f), plse(lse.size());
        AttentionShape ps = s;
        ps.block_table = table.data(), ps.block = block, ps.blocks_per_row = M;
        if (bf16) {
          const auto kb = as_bf16(k), vb = as_bf16(v), pkb = as_bf16(pk), pvb = as_bf16(pv);
          redco::cpu::decode_attention_forward(s, q.data(), kb.data(), vb.data(), true, o.data(),
                                               lse.data());
          redco::cpu::decode_attention_forward(ps, q.data(), pkb.data(), pvb.data(), true,
                                               po.data(), plse.data());
        } else {
          redco::cpu::decode_attention_forward(s, q.data(), k.data(), v.data(), false, o.data(),
                                               lse.data());
          redco::cpu::decode_attention_forward(ps, q.data(), pk.data(), pv.data(), false, po.data(),
                                               plse.data());
        }
        for (size_t i = 0; i < o.size(); ++i) REQUIRE(po[i] == o[i]);
        for (size_t i = 0; i < lse.size(); ++i) REQUIRE(plse[i] == lse[i]);
      }
  Vf q(8), k(8);
  AttentionShape s = make_shape(1, 1, 1, 1, 8, 8, true);
  const int64_t table[] = {0};
  s.block_table = table, s.block = 8, s.blocks_per_row = 1;
  Vf o(8), lse(1);
  REQUIRE_THROWS_WITH(
      redco::cpu::flash_attention_forward(s, q.data(), k.data(), k.data(), o.data(), lse.data()),
      Catch::Contains("paged KV cache"));
}
