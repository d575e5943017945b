// The search over meshes, ZeRO stages, recomputation and micro-batches.
#include "redco/plan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "redco/core/error.hpp"

namespace redco::plan {
namespace {

// The caching allocator's free memory between buffers of different sizes
// (measured on tests/test_memory_model's runs below 5% of the peak).
constexpr double kFragmentation = 0.05;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Micro-batches that divide a replica's rows: powers of two and the whole.
std::vector<int64_t> micro_batches(int64_t rows) {
  std::vector<int64_t> m;
  for (int64_t b = 1; b <= rows; b *= 2)
    if (rows % b == 0) m.push_back(b);
  if (m.back() != rows) m.push_back(rows);
  return m;
}

template <typename T>
std::vector<T> options(const std::optional<T>& pinned, std::vector<T> all) {
  return pinned ? std::vector<T>{*pinned} : all;
}

}  // namespace

uint64_t needed_bytes(const MemoryBreakdown& m) {
  return uint64_t(double(m.peak()) * (1.0 + kFragmentation));
}

std::vector<Candidate> search(const Request& r) {
  const Cluster& c = r.cluster;
  REDCO_CHECK(c.devices >= 1 && c.hosts >= 1 && c.devices % c.hosts == 0,
              "plan: {} devices on {} hosts; give a device count that the hosts share evenly",
              c.devices, c.hosts);
  REDCO_CHECK(r.seq_len >= 1, "plan: sequence length {} must be positive", r.seq_len);
  std::vector<Candidate> all;
  for (int mp : options(r.mp, divisors(c.devices))) {
    REDCO_CHECK(c.devices % mp == 0, "plan: {} model shards do not divide {} devices", mp,
                c.devices);
    const int dp = c.devices / mp;
    const int64_t global = r.global_batch ? r.global_batch : dp;
    if (global % dp != 0) continue;  // every replica takes the same number of rows
    std::vector<int> stages;
    for (int z = 0; z <= r.max_zero; ++z)
      if (z == 0 || dp > 1) stages.push_back(z);
    for (int zero : options(r.zero, stages))
      for (bool recompute : options(r.recompute, {false, true}))
        for (int64_t micro : options(r.micro_batch, micro_batches(global / dp))) {
          if ((global / dp) % micro != 0) continue;
          Candidate k;
          k.work = {.seq_len = r.seq_len,
                    .source_len = r.source_len,
                    .micro_batch = micro,
                    .accumulation = global / dp / micro,
                    .precision = r.precision,
                    .optimizer = r.optimizer};
          k.par = {.dp = dp, .mp = mp, .zero = zero, .recompute = recompute};
          k.memory = training_memory(r.model, k.work, k.par);
          k.time = step_time(r.model, k.work, k.par, c);
          k.needed = needed_bytes(k.memory);
          k.fits = k.needed + c.device.reserved <= c.device.memory;
          all.push_back(k);
        }
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return a.needed < b.needed;  // the nearest misses first
    // Within 1% of each other the model cannot tell them apart: the simpler
    // cut wins (larger micro-batches, which the model does not reward for
    // their larger GEMMs; fewer shards; a lower stage; no recomputation).
    const double ta = a.time.tokens_per_s, tb = b.time.tokens_per_s;
    if (std::abs(ta - tb) > 0.01 * std::max(ta, tb)) return ta > tb;
    auto simple = [](const Candidate& k) {
      return std::tuple(-k.work.micro_batch, k.par.mp, k.par.zero, k.par.recompute);
    };
    return simple(a) < simple(b);
  });
  return all;
}

uint64_t parse_size(const std::string& text, std::string_view flag) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit == "GB"                   ? 1e9
                       : unit == "GiB" || unit == "G" ? double(uint64_t(1) << 30)
                       : unit == "MB"                 ? 1e6
                       : unit == "MiB" || unit == "M" ? double(uint64_t(1) << 20)
                       : unit == "TB"                 ? 1e12
                                                      : -1;
  REDCO_CHECK(used > 0 && v > 0 && scale > 0,
              "{} '{}' is not a size; write it like 40GB (10^9 bytes), 40GiB or 40G (2^30), "
              "512MB or 512MiB",
              flag, text);
  return uint64_t(v * scale);
}

std::string bytes_text(uint64_t bytes) {
  const double mib = double(bytes) / double(uint64_t(1) << 20);
  return mib < 1024 ? fmt::format("{:.1f} MiB", mib) : fmt::format("{:.2f} GiB", mib / 1024);
}

std::string describe_need(const Candidate& k) {
  const MemoryBreakdown& m = k.memory;
  const uint64_t params = m.params + m.gathered, lasting = params + m.opt_state;
  return fmt::format(
      "parameters {} + optimizer state {} + the step {} (activations {}, gradients {}, with a 5% "
      "margin) = {} per rank",
      bytes_text(params), bytes_text(m.opt_state), bytes_text(k.needed - lasting),
      bytes_text(m.activations), bytes_text(m.grads + m.buckets + m.accumulated),
      bytes_text(k.needed));
}

std::optional<Candidate> best(const Request& r) {
  std::vector<Candidate> all = search(r);
  if (all.empty() || !all.front().fits) return std::nullopt;
  return all.front();
}

int64_t max_seq_len(Request r) {
  r.global_batch = 0;  // one row per replica
  r.micro_batch = 1;
  auto fits = [&](int64_t len) {
    r.seq_len = len;
    if (r.source_len) r.source_len = len;
    return best(r).has_value();
  };
  if (!fits(64)) return 0;
  // A learned position table ends the search at its length.
  const int64_t cap = r.model.context > 0 ? r.model.context : int64_t(1) << 24;
  if (fits(cap)) return cap;
  int64_t lo = 64, hi = 128;
  while (hi < cap && fits(hi)) lo = hi, hi *= 2;
  hi = std::min(hi, cap);
  while (hi - lo > 64) {
    const int64_t mid = (lo + hi) / 2 / 64 * 64;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace redco::plan
