// Memory accounting of a training step (see memory_account.hpp).
#include "redco/train/memory_account.hpp"

#include <fmt/format.h>

#include <array>

#include "redco/comm/comm.hpp"
#include "redco/core/allocator.hpp"
#include "redco/core/device_memory.hpp"
#include "redco/sched/task.hpp"

namespace redco::train {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kParts = 7;
constexpr std::array<const char*, kParts> kNames = {
    "params", "grads", "opt_state", "activations", "slack", "grad_peak", "peak"};

std::array<uint64_t, kParts> parts(const MemoryAccount& a) {
  return {a.params, a.grads, a.opt_state, a.activations, a.slack, a.grad_peak, a.peak};
}

}  // namespace

// The allocator of `device`: the CPU's caching allocator or the device's own pool.
static AllocatorStats memory_stats(Device device) {
  return device.is_cpu() ? CachingAllocator::cpu().stats()
                         : device_memory(device).stats(device.index);
}

void reset_peak(Device device) {
  if (device.is_cpu()) CachingAllocator::cpu().reset_peak();
  if (device.kind == DeviceKind::test) CachingAllocator::test_device().reset_peak();
}

AllocatorDelta::AllocatorDelta(Device device)
    : device_(device), held_(memory_stats(device).bytes_in_use) {}

uint64_t AllocatorDelta::bytes() const {
  return uint64_t(memory_stats(device_).bytes_in_use - held_);
}

MemoryAccount account_now(const ParamTree& params, const ParamTree& grads,
                          const ParamTree& opt_state, uint64_t activations, Device device) {
  return {.params = tree_bytes(params),
          .grads = tree_bytes(grads),
          .opt_state = tree_bytes(opt_state),
          .activations = activations,
          .slack = memory_stats(device).bytes_cached,
          .peak = memory_stats(device).peak_bytes_in_use};
}

uint64_t tree_bytes(const ParamTree& tree) {
  uint64_t n = 0;
  for (const auto& [name, t] : tree) n += uint64_t(t.nbytes());
  return n;
}

std::vector<MemoryAccount> gather_accounts(const MemoryAccount& mine, comm::Comm* world) {
  if (!world || world->size() == 1) return {mine};
  const int n = world->size(), r = world->rank();
  // [n * kParts] KiB, this rank's slot filled, summed over the ranks: exact
  // in f32 up to 16 GiB per part.
  Tensor all = Tensor::zeros(Shape{int64_t(n) * kParts});
  const std::array<uint64_t, kParts> p = parts(mine);
  for (int i = 0; i < kParts; ++i) all.data<float>()[r * kParts + i] = float(double(p[i]) / 1024);
  sched::sync_wait(world->all_reduce(all));
  std::vector<MemoryAccount> out(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    const float* v = all.data<float>() + k * kParts;
    auto bytes = [&](int i) { return uint64_t(double(v[i]) * 1024); };
    out[size_t(k)] = {bytes(0), bytes(1), bytes(2), bytes(3), bytes(4), bytes(5), bytes(6)};
  }
  out[size_t(r)] = mine;  // exact for this rank
  return out;
}

io::Metrics memory_metrics(const std::vector<MemoryAccount>& ranks) {
  io::Metrics m;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::array<uint64_t, kParts> p = parts(ranks[r]);
    for (int i = 0; i < kParts; ++i)
      m.emplace_back(fmt::format("rank{}.{}_mib", r, kNames[size_t(i)]),
                     double(p[size_t(i)]) / kMiB);
  }
  return m;
}

std::string describe(const MemoryAccount& a, int rank) {
  return fmt::format(
      "memory rank {}: params {:.1f} MiB, grads {:.1f} MiB, optimizer state {:.1f} MiB, "
      "activations {:.1f} MiB, allocator slack {:.1f} MiB, gradient peak {:.1f} MiB, step peak "
      "{:.1f} MiB",
      rank, double(a.params) / kMiB, double(a.grads) / kMiB, double(a.opt_state) / kMiB,
      double(a.activations) / kMiB, double(a.slack) / kMiB, double(a.grad_peak) / kMiB,
      double(a.peak) / kMiB);
}

}  // namespace redco::train
