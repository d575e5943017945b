#pragma once
// What the Hugging Face checkpoint tests share: the committed fixtures
// (tests/fixtures/hf, from tests/python/make_hf_fixtures.py) and scratch folders.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "redco/core/tensor.hpp"

namespace redco::test {

// tests/fixtures/hf/<name> of the source tree (REDCO_ROOT, set by meson).
inline std::filesystem::path hf_fixture(const std::string& name = "") {
  const char* root = std::getenv("REDCO_ROOT");
  const std::filesystem::path base =
      root ? std::filesystem::path(root)
           : std::filesystem::path(__FILE__).parent_path().parent_path();
  const std::filesystem::path dir = base / "tests" / "fixtures" / "hf";
  return name.empty() ? dir : dir / name;
}

// A fresh folder under the temporary directory, removed with its contents.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "hf") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           fmt::format("redco-test-{}-{}-{}", tag, ::getpid(), counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// The largest |entry|.
inline float max_abs(const Tensor& t) {
  float m = 0.f;
  for (float v : t.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

// The largest difference of [..., D] outputs over the rows a mask [...]
// keeps: transformers' outputs at padding positions are arbitrary, and so
// are redco's.
inline float max_diff_unpadded(const Tensor& got, const Tensor& want, const Tensor& mask) {
  REQUIRE(got.shape() == want.shape());
  const int64_t D = got.dim(-1);
  const auto a = got.to_vector(), b = want.to_vector();
  const int64_t* m = mask.data<int64_t>();
  float worst = 0.f;
  for (int64_t r = 0; r < mask.numel(); ++r)
    for (int64_t v = 0; m[r] && v < D; ++v)
      worst = std::max(worst, std::abs(a[size_t(r * D + v)] - b[size_t(r * D + v)]));
  return worst;
}

}  // namespace redco::test
