#pragma once
// Comparisons of trained parameters and losses for the ZeRO tests: bitwise,
// and within a relative tolerance.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "redco/autodiff/value_and_grad.hpp"

namespace redco::test {

inline void check_bitwise(const ParamTree& got, const ParamTree& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO("'" << name << "'");
    const Tensor& u = got.at(name);
    CHECK((u.shape() == t.shape() && std::memcmp(u.raw(), t.raw(), t.nbytes()) == 0));
  }
}

// Every element within rel of the largest magnitude of its tensor.
inline void check_close(const ParamTree& got, const ParamTree& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO("'" << name << "'");
    const Tensor& u = got.at(name);
    REQUIRE(u.shape() == t.shape());
    double scale = 0, diff = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      scale = std::max(scale, double(std::abs(t.data<float>()[i])));
      diff = std::max(diff, double(std::abs(u.data<float>()[i] - t.data<float>()[i])));
    }
    CHECK(diff <= rel * scale);
  }
}

inline void check_close(const std::vector<double>& got, const std::vector<double>& want,
                        double rel) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i + 1 << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]));
  }
}

}  // namespace redco::test
