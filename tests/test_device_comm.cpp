// A program linked the way a user's is (libredco, nothing NCCL-specific named)
// must still get the CUDA build's NCCL transport: a static library would
// otherwise drop the object that registers it. Needs no GPU.
#include <catch2/catch.hpp>

#include "redco/comm/device_comm.hpp"

namespace redco {
namespace {

TEST_CASE("a CUDA build with NCCL's header registers NCCL for CUDA devices, none other",
          "[device]") {
#ifdef REDCO_EXPECT_NCCL
  CHECK(comm::has_device_comm(DeviceKind::cuda));
#else
  CHECK_FALSE(comm::has_device_comm(DeviceKind::cuda));
#endif
  CHECK_FALSE(comm::has_device_comm(DeviceKind::cpu));
  CHECK_FALSE(comm::has_device_comm(DeviceKind::test));
}

}  // namespace
}  // namespace redco
