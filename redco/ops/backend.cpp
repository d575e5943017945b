#include "redco/ops/backend.hpp"

#include <array>

#include "redco/ops/cpu/backend_cpu.hpp"

namespace redco {
namespace {
std::array<Backend*, kDeviceKinds>& registry() {
  static CpuBackend cpu;
  static std::array<Backend*, kDeviceKinds> r{&cpu, nullptr};
  return r;
}
}  // namespace

Backend& backend(Device device) {
  Backend* b = registry()[size_t(device.kind)];
  REDCO_CHECK(b, "no backend for device {}: this build of redco has no CUDA support "
              "(reconfigure with -Dcuda=enabled on a machine with the CUDA toolkit)", device.str());
  return *b;
}

void register_backend(DeviceKind kind, Backend* b) { registry()[size_t(kind)] = b; }

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int r = std::max(a.rank(), b.rank());
  std::array<int64_t, Shape::kMaxRank> dims{};
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    REDCO_CHECK(da == db || da == 1 || db == 1,
                "{}: shapes {} and {} cannot be broadcast together (axis {}: {} vs {})", op, a, b,
                i - r, da, db);
    dims[size_t(i)] = da == 1 ? db : da;
  }
  return Shape(std::span<const int64_t>(dims.data(), size_t(r)));
}

}  // namespace redco
