#pragma once
// What the CUDA test files share: the device, the GPU guard (SKIP, exit 77,
// without a GPU), random inputs, and the comparison against the CPU.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "redco/ops/backend.hpp"
#include "redco/ops/cuda/cuda_backend.hpp"
#include "skip.hpp"

namespace redco::cuda_test {

inline const Device kGpu = Device::cuda(0);

// Without a GPU the whole run is skipped (exit 77), never passed.
#define REQUIRE_GPU()                     \
  if (::redco::cuda::device_count() == 0) \
  ::redco::test::skip("no CUDA device visible (cudaGetDeviceCount() is 0)")

inline Backend& cpu() { return backend(Device::cpu()); }
inline Backend& gpu() { return backend(kGpu); }
inline Tensor dev(const Tensor& t) { return t.to(kGpu); }
inline Tensor rnd(const Shape& s, uint64_t seed, float lo = -2.f, float hi = 2.f) {
  return Tensor::uniform(s, seed, 11, lo, hi);
}
inline Tensor ids(const Shape& s, uint64_t seed, int64_t V) {
  Tensor u = rnd(s, seed, 0.f, float(V) - 0.01f);
  std::vector<int64_t> v;
  for (float f : u.to_vector()) v.push_back(int64_t(f));
  return Tensor::from<int64_t>(v, s);
}

// |gpu - cpu| <= atol + rtol |cpu| everywhere; the GPU tensor comes back first.
inline void close(const Tensor& g, const Tensor& c, float rtol, float atol) {
  REQUIRE(g.device() == kGpu);
  REQUIRE(g.shape() == c.shape());
  REQUIRE(g.dtype() == c.dtype());
  const std::vector<float> a = g.to(Device::cpu()).to_vector(), b = c.to_vector();
  double worst = 0;
  size_t at = 0;
  bool ok = true;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(double(a[i]) - b[i]), tol = atol + rtol * std::fabs(b[i]);
    const bool bad = !(err <= tol) && !(std::isnan(a[i]) && std::isnan(b[i])) &&
                     !(std::isinf(a[i]) && a[i] == b[i]);
    if (bad && (ok || err > worst)) worst = err, at = i;
    ok = ok && !bad;
  }
  INFO("shape " << c.shape().str() << ": worst |diff| " << worst << " at " << at << " (gpu "
                << (a.empty() ? 0 : a[at]) << ", cpu " << (b.empty() ? 0 : b[at]) << ")");
  CHECK(ok);
}
inline void same(const Tensor& g, const Tensor& c) { close(g, c, 0.f, 0.f); }

}  // namespace redco::cuda_test
