#pragma once
// Shared by test_pipelines.cpp and test_custom_step.cpp: a linear regression
// problem with closed-form gradients (the hand references), a tiny sequence
// task for a GPT on meshes, and comparison helpers.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "redco/comm/threads_comm.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/train/trainer.hpp"

namespace pipelines {

using namespace redco;
using namespace redco::train;
namespace fs = std::filesystem;

// ---- a linear regression problem: y = <w*, x> + b* + noise -------------------------------

constexpr int64_t kIn = 3;

struct Point {
  std::array<float, kIn> x{};
  float y = 0;
};
struct Batch {
  Tensor x, y;  // [n, kIn], [n, 1]
};

inline std::vector<Point> make_points(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<Point> out(static_cast<size_t>(n));
  for (Point& p : out) {
    for (float& v : p.x) v = normal(rng);
    p.y = 0.5f * p.x[0] - 1.f * p.x[1] + 2.f * p.x[2] + 0.3f + 0.1f * normal(rng);
  }
  return out;
}

inline Batch collate(std::span<const Point> ps) {
  const auto n = int64_t(ps.size());
  Batch b{Tensor::empty({n, kIn}), Tensor::empty({n, 1})};
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(ps[size_t(i)].x.begin(), kIn, b.x.data<float>() + i * kIn);
    b.y.data<float>()[i] = ps[size_t(i)].y;
  }
  return b;
}

inline Tensor mse(const Tensor& pred, const Tensor& y) { return mean(square(pred - y)); }

// Weights of a Linear(kIn, 1) as doubles: w[0..kIn) then the bias.
using Vec = std::vector<double>;
inline Vec weights(const ParamTree& p, const std::string& prefix) {
  const float* w = p.at(prefix + "weight").data<float>();
  Vec out(w, w + kIn);
  out.push_back(p.at(prefix + "bias").data<float>()[0]);
  return out;
}

// d/dθ of mean((<w, x> + b - y)^2) over `ps`, at θ = (w, b).
inline Vec mse_grad(const Vec& th, std::span<const Point> ps) {
  Vec g(kIn + 1, 0.0);
  for (const Point& p : ps) {
    double r = th[kIn] - p.y;
    for (int64_t k = 0; k < kIn; ++k) r += th[size_t(k)] * p.x[size_t(k)];
    for (int64_t k = 0; k < kIn; ++k) g[size_t(k)] += 2 * r * p.x[size_t(k)] / double(ps.size());
    g[kIn] += 2 * r / double(ps.size());
  }
  return g;
}

inline void check_vec(const Vec& got, const Vec& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

inline bool bitwise_equal(const ParamTree& a, const ParamTree& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end() || t.shape() != it->second.shape() ||
        std::memcmp(t.raw(), it->second.raw(), t.nbytes()) != 0) {
      UNSCOPED_INFO("'" << name << "' differs");
      return false;
    }
  }
  return true;
}

inline ParamTree clone(const ParamTree& p) {
  ParamTree out;
  for (const auto& [n, t] : p) out.emplace(n, t.clone());
  return out;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           fmt::format("redco-pipelines-{}-{}", ::getpid(), std::random_device{}());
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Three linear parts whose outputs are summed.
inline const auto three =
    nn::parts(nn::named<"a">(nn::linear(kIn, 1)), nn::named<"b">(nn::linear(kIn, 1)),
              nn::named<"frozen">(nn::linear(kIn, 1)));
inline const auto sum_loss = [](auto& m, const Batch& b, Rng) {
  return mse(part<"a">(m)(b.x) + part<"b">(m)(b.x) + part<"frozen">(m)(b.x), b.y);
};

// ---- a tiny sequence task for a GPT on meshes of threads ------------------------------------

constexpr int64_t kT = 8, kVocab = 32;
struct Seq {
  std::vector<int64_t> ids;  // kT + 1 tokens
};
struct LmBatch {
  Tensor inputs, targets;
};
inline std::vector<Seq> make_seqs(int64_t n) {
  std::mt19937_64 rng(5);
  std::vector<Seq> out(static_cast<size_t>(n));
  for (Seq& s : out) {
    const auto k = int64_t(rng() % 4);
    s.ids.push_back(int64_t(rng() % kVocab));
    for (int64_t t = 0; t < kT; ++t) s.ids.push_back((3 * s.ids.back() + k) % kVocab);
  }
  return out;
}
inline LmBatch lm_collate(std::span<const Seq> ex) {
  const auto n = int64_t(ex.size());
  LmBatch b{Tensor::empty({n, kT}, DType::i64), Tensor::empty({n, kT}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(ex[size_t(i)].ids.begin(), kT, b.inputs.data<int64_t>() + i * kT);
    std::copy_n(ex[size_t(i)].ids.begin() + 1, kT, b.targets.data<int64_t>() + i * kT);
  }
  return b;
}

}  // namespace pipelines
