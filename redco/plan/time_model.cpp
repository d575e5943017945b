// FLOPs, collective volumes and the step time they add up to.
#include "redco/plan/time_model.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "redco/core/error.hpp"

namespace redco::plan {
namespace {

constexpr double kGB = 1e9, kT = 1e12;
constexpr uint64_t kGiB = uint64_t(1) << 30;

struct NamedDevice {
  const char* name;
  DeviceSpec spec;
};
// Sustained rates: about half the data sheet's dense tensor-core peak for
// GPUs and TPUs (what well-tuned large-model training reaches), the f32 rate
// through TF32 where the device has it. The GTX 1080 Ti has neither tensor
// cores nor bf16: both rates are its f32 FMA rate, sustained at ~60%. The CPU
// preset is this project's 2-core development VM (bench_peak: ~150 GFLOP/s
// f32 AVX-512 peak, fit() at 86% of it). Accelerators lose about half a GiB
// to their runtime's context before the first allocation.
const std::vector<NamedDevice>& devices() {
  static const std::vector<NamedDevice> d = {
      {"h100", {"NVIDIA H100 SXM 80 GB", 0.5 * 495 * kT, 0.5 * 989 * kT, 80 * kGiB, kGiB / 2}},
      {"h200", {"NVIDIA H200 141 GB", 0.5 * 495 * kT, 0.5 * 989 * kT, 141 * kGiB, kGiB / 2}},
      {"a100-40gb", {"NVIDIA A100 40 GB", 0.5 * 156 * kT, 0.5 * 312 * kT, 40 * kGiB, kGiB / 2}},
      {"a100-80gb", {"NVIDIA A100 80 GB", 0.5 * 156 * kT, 0.5 * 312 * kT, 80 * kGiB, kGiB / 2}},
      {"1080ti",
       {"NVIDIA GTX 1080 Ti 11 GB", 0.6 * 11.3 * kT, 0.6 * 11.3 * kT, 11 * kGiB, kGiB / 2}},
      {"tpu-v4", {"TPU v4 chip 32 GB", 0.5 * 275 * kT / 3, 0.5 * 275 * kT, 32 * kGiB, kGiB / 2}},
      {"cpu", {"CPU, 2 cores with AVX-512", 0.86 * 150e9, 0.86 * 300e9, 24 * kGiB}},
  };
  return d;
}

struct NamedLink {
  const char* name;
  LinkSpec spec;
};
// Bus bandwidth of a ring all-reduce per device (what NCCL's tests report as
// busbw, roughly 80% of the link's one-way rate) and one collective's latency.
const std::vector<NamedLink>& links() {
  static const std::vector<NamedLink> l = {
      {"nvlink4", {"NVLink 4 (H100 SXM, 450 GB/s each way)", 360 * kGB, 20e-6}},
      {"nvlink3", {"NVLink 3 (A100 SXM, 300 GB/s each way)", 230 * kGB, 20e-6}},
      {"pcie3", {"PCIe 3.0 x16 (through the host)", 10 * kGB, 30e-6}},
      {"pcie4", {"PCIe 4.0 x16 (through the host)", 20 * kGB, 30e-6}},
      {"ib-ndr", {"InfiniBand NDR, one 400 Gb/s port per device", 40 * kGB, 30e-6}},
      {"ib-hdr", {"InfiniBand HDR, one 200 Gb/s port per device", 20 * kGB, 30e-6}},
      {"ici", {"TPU v4 inter-chip interconnect", 80 * kGB, 20e-6}},
      {"eth100", {"100 Gb/s Ethernet (RoCE)", 10 * kGB, 50e-6}},
      // TCP's payload rate on Ethernet, 94% of the line rate: UCX's ring
      // all-reduce reached 0.118 GB/s bus bandwidth over a veth link shaped to
      // 1 Gbit/s (tools/bench/wire_bound.sh).
      {"tcp10", {"10 Gb/s Ethernet, TCP", 1.17 * kGB, 100e-6}},
      {"tcp1", {"1 Gb/s Ethernet, TCP", 0.117 * kGB, 200e-6}},
      {"shm", {"shared memory between processes of one host (UCX)", 4 * kGB, 10e-6}},
  };
  return l;
}

template <typename T>
std::vector<std::string> names_of(const std::vector<T>& v) {
  std::vector<std::string> n;
  for (const T& x : v) n.push_back(x.name);
  return n;
}

// One ring collective moving `bytes` per rank over `n` ranks: an all-reduce
// moves 2 (n-1)/n of them, a reduce-scatter or an all-gather (n-1)/n.
double ring(double bytes, int n, double factor, const LinkSpec& link) {
  if (n <= 1 || bytes <= 0) return 0;
  return link.latency + factor * double(n - 1) / double(n) * bytes / link.bandwidth;
}

bool is_matmul(const nn::ParamEntry& e) {
  using shard::Role;
  switch (e.role) {
    case Role::column:
    case Role::row:
    case Role::attn_q:
    case Role::attn_k:
    case Role::attn_v:
    case Role::attn_o:
      return e.shape.shape().rank() == 2;
    default:
      return false;
  }
}

}  // namespace

DeviceSpec device_preset(const std::string& name) {
  for (const NamedDevice& d : devices())
    if (name == d.name) return d.spec;
  fail("unknown device '{}'; the presets are {} (or give --flops and --memory)", name,
       fmt::join(device_names(), ", "));
}
LinkSpec link_preset(const std::string& name) {
  for (const NamedLink& l : links())
    if (name == l.name) return l.spec;
  fail("unknown link '{}'; the presets are {}", name, fmt::join(link_names(), ", "));
}
std::vector<std::string> device_names() { return names_of(devices()); }
std::vector<std::string> link_names() { return names_of(links()); }

double overlap_of(bool accelerator, int hosts) { return accelerator ? 1.0 : hosts > 1 ? 0.4 : 0.0; }

double forward_flops_per_token(const ModelShape& m, int64_t len) {
  double per_token = 0;  // 2 FLOPs per weight of every matmul a token goes through
  for (const nn::ParamEntry& e : m.entries)
    if (is_matmul(e)) per_token += 2.0 * double(e.shape.shape().numel());
  if (m.classes == 0) per_token += 2.0 * double(m.vocab) * double(m.dim);  // the LM head
  for (const Stack& s : m.stacks) {  // q k^T and p v: 4 x width FLOPs per key
    const double keys = s.causal ? double(len + 1) / 2 : double(len);
    per_token += double(s.layers) * 4.0 * keys * double(s.self_width + s.cross_width);
  }
  // An encoder-decoder's weights are split between the two sequences; over
  // equal lengths, the sum above is the cost of one source and one target token.
  return m.encoder_decoder ? per_token / 2 : per_token;
}

StepTime step_time(const ModelShape& m, const Workload& w, const Parallelism& par,
                   const Cluster& c) {
  StepTime t;
  const int64_t src = w.source_len ? w.source_len : w.seq_len;
  const double tokens = double(w.micro_batch) * double(w.accumulation) *
                        (m.encoder_decoder ? double(w.seq_len + src) : double(w.seq_len));
  const double passes = 3.0 + (par.recompute ? 1.0 : 0.0);  // forward, backward = 2 forwards
  t.flops = passes * forward_flops_per_token(m, std::max(w.seq_len, src)) * tokens / par.mp;
  const double rate = w.precision == Precision::bf16 ? c.device.bf16_flops : c.device.f32_flops;
  t.compute = t.flops / rate;
  const double backward = t.compute * 2.0 / passes;

  // Tensor parallelism: an all-reduce of the block's output [tokens, d] (f32)
  // after each split sublayer forward, and one of its input gradient backward.
  const LinkSpec& tp_link = c.hosts > 1 && par.mp > c.devices / c.hosts ? c.inter : c.intra;
  for (const Stack& s : m.stacks) {
    const double n = double(w.micro_batch) * double(s.over_source ? src : w.seq_len);
    const double per = ring(n * double(m.dim) * 4.0, par.mp, 2.0, tp_link);
    t.tp_comm += double(w.accumulation) * double(s.layers * s.reductions) * 2.0 * per;
  }

  // Data parallelism over the replicas: the gradients' all-reduce (ZeRO-1/2:
  // a reduce-scatter of them and an all-gather of the updated parameters,
  // the same volume); ZeRO-3 gathers the parameters for forward and again
  // for backward. Once per micro-batch.
  const LinkSpec& dp_link = c.hosts > 1 ? c.inter : c.intra;
  const MemoryBreakdown mem = training_memory(m, w, par);
  const double p = double(par.zero >= 3 && par.dp > 1 ? mem.params * uint64_t(par.dp) : mem.params);
  const double volume = par.zero >= 3 ? 3.0 : 2.0;
  t.dp_comm = double(w.accumulation) * ring(p, par.dp, volume, dp_link);
  // Buckets go as backward finishes them (ZeRO-3's gathers are prefetched
  // one block ahead): hidden behind compute up to the link's overlap, the
  // last bucket always exposed.
  const double hidden_behind = par.zero >= 3 ? t.compute : backward;
  const double last = ring(double(par.bucket_bytes), par.dp, 2.0, dp_link);
  t.exposed = par.dp > 1 ? std::max(last, t.dp_comm - c.overlap * hidden_behind) : 0.0;
  t.seconds = t.compute + t.tp_comm + t.exposed;
  t.tokens_per_s = tokens * double(par.dp) / t.seconds;
  return t;
}

}  // namespace redco::plan
