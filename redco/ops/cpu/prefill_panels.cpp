// Prefill against bf16 decode panels on bf16 dot-product units
// (prefill_panels.hpp).
//
// Both units want the weights in "pairs of k" order: the 32-bit lane of output
// n holds w[n, 2r] (low half) and w[n, 2r + 1] (high half). A panel stores
// one cache line per k with outputs j and j + 16 in lane j, so two lines
// (k = 2r and 2r + 1) give, with two ANDs, two shifts and two ORs, the pair
// rows of outputs 0-15 and of outputs 16-31. Each task repacks one panel
// (K x 64 bytes, in L2) and multiplies every row of x against it, so the
// repacking costs 1/M of the multiply-adds.
//
// Why 32 rows (kPrefillRows): LLaMA 1.1B's projections, 2 threads, AMX
// (Sapphire Rapids-class Xeon), the f32 chain and this kernel alternating
// in one process: see docs/generation.md, "Prefill on bf16 units".
#include "redco/ops/cpu/prefill_panels.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "redco/core/dtype.hpp"
#include "redco/core/error.hpp"
#include "redco/ops/cpu/best_of_three.hpp"
#include "redco/ops/cpu/panel_layout.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/skinny_panels.hpp"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define REDCO_PREFILL_DPBF16 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define REDCO_PREFILL_AMX 1
#endif
#endif

namespace redco::cpu {
namespace {

using panels::kRows;
using Words = std::vector<uint32_t, Eigen::aligned_allocator<uint32_t>>;

constexpr int64_t kHalf = kRows / 2;  // outputs a 64-byte pair row holds
constexpr int64_t kBlockK = 32;       // k per AMX tile row (16 pairs)

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// y rows [m, m + rows) of outputs [n0, n0 + valid) from block [rows][32], times scale[n] if given.
[[maybe_unused]] void store_block(const float* block, int64_t rows, float* y, int64_t ldy,
                                  int64_t n0, int64_t valid, const float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = y + r * ldy + n0;
    if (!scale) {
      std::memcpy(dst, block + r * kRows, size_t(valid) * sizeof(float));
      continue;
    }
    for (int64_t j = 0; j < valid; ++j) dst[j] = block[r * kRows + j] * scale[n0 + j];
  }
}

#if REDCO_PREFILL_DPBF16
// One panel in pairs-of-k order: lo[r * 16 + j] holds output j's weights at
// k = 2r, 2r + 1; hi[...] output j + 16's. Pair rows past K are zero.
void repack(const uint16_t* p, int64_t K, int64_t Kp, uint32_t* lo, uint32_t* hi) {
  const __m512i low16 = _mm512_set1_epi32(0xffff);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t r = 0; r < Kp / 2; ++r) {
    const int64_t k = 2 * r;
    const __m512i a = k < K ? _mm512_loadu_si512(p + k * kRows) : zero;
    const __m512i b = k + 1 < K ? _mm512_loadu_si512(p + (k + 1) * kRows) : zero;
    _mm512_store_si512(lo + r * kHalf,
                       _mm512_or_si512(_mm512_and_si512(a, low16), _mm512_slli_epi32(b, 16)));
    _mm512_store_si512(hi + r * kHalf,
                       _mm512_or_si512(_mm512_srli_epi32(a, 16), _mm512_andnot_si512(low16, b)));
  }
}

// Half `half` (outputs 32 * half .. + 32) of an int8 panel (panels::i8) in
// the same pairs-of-k order. An int8 value is exact in bf16: the top half of
// its f32.
void repack_i8(const int8_t* p, int64_t half, int64_t K, int64_t Kp, uint32_t* lo, uint32_t* hi) {
  const __m512i high16 = _mm512_set1_epi32(int(0xffff0000u));
  const auto widened = [&](int64_t k, int64_t part) {  // outputs 16 * part .. of the half at k
    if (k >= K) return _mm512_setzero_si512();
    const int8_t* at = p + k * panels::i8::kRows + 32 * half + 16 * part;
    return _mm512_castps_si512(_mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)))));
  };
  for (int64_t r = 0; r < Kp / 2; ++r) {
    const int64_t k = 2 * r;
    uint32_t* out[2] = {lo + r * kHalf, hi + r * kHalf};
    for (int64_t part = 0; part < 2; ++part)
      _mm512_store_si512(out[part],
                         _mm512_or_si512(_mm512_srli_epi32(widened(k, part), 16),
                                         _mm512_and_si512(widened(k + 1, part), high16)));
  }
}

// MB rows of x (bf16, pairs as 32-bit words, rows Kp/2 words apart) against
// one repacked panel: 2 * MB accumulators of 16 outputs.
template <int MB>
void dp_block(const uint32_t* xw, int64_t ldxw, const uint32_t* lo, const uint32_t* hi,
              int64_t pairs, float* out /* [MB][32] */) {
  __m512 acc_lo[MB], acc_hi[MB];
  for (int r = 0; r < MB; ++r) acc_lo[r] = acc_hi[r] = _mm512_setzero_ps();
  for (int64_t q = 0; q < pairs; ++q) {
    const __m512bh w_lo = (__m512bh)_mm512_load_si512(lo + q * kHalf);
    const __m512bh w_hi = (__m512bh)_mm512_load_si512(hi + q * kHalf);
    for (int r = 0; r < MB; ++r) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xw[r * ldxw + q]));
      acc_lo[r] = _mm512_dpbf16_ps(acc_lo[r], w_lo, xb);
      acc_hi[r] = _mm512_dpbf16_ps(acc_hi[r], w_hi, xb);
    }
  }
  for (int r = 0; r < MB; ++r) {
    _mm512_storeu_ps(out + r * kRows, acc_lo[r]);
    _mm512_storeu_ps(out + r * kRows + kHalf, acc_hi[r]);
  }
}

constexpr int kDpRows = 8;  // 16 accumulators, as the decode kernel

void dp_panel(const uint32_t* xw, int64_t ldxw, int64_t M, const uint32_t* lo, const uint32_t* hi,
              int64_t pairs, float* block /* [kDpRows][32] */, float* y, int64_t ldy, int64_t n0,
              int64_t valid, const float* scale) {
  using Fn = void (*)(const uint32_t*, int64_t, const uint32_t*, const uint32_t*, int64_t, float*);
  static constexpr Fn kFns[kDpRows] = {dp_block<1>, dp_block<2>, dp_block<3>, dp_block<4>,
                                       dp_block<5>, dp_block<6>, dp_block<7>, dp_block<8>};
  for (int64_t m = 0; m < M; m += kDpRows) {
    const int64_t rows = std::min<int64_t>(kDpRows, M - m);
    kFns[rows - 1](xw + m * ldxw, ldxw, lo, hi, pairs, block);
    store_block(block, rows, y + m * ldy, ldy, n0, valid, scale);
  }
}
#endif

#if REDCO_PREFILL_AMX
// Eight tiles of 16 rows x 64 bytes: C 0-3 (rows 0-15 / 16-31 x outputs
// 0-15 / 16-31), A 4-5 (rows 0-15 / 16-31, 32 k), B 6-7 (16 pair rows, the
// panel's two output halves).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Rows [m, m + 32) of xb (bf16, Kp apart, zero past M) against one repacked
// panel into out [32][32].
void amx_block(const uint16_t* xb, int64_t Kp, const uint32_t* lo, const uint32_t* hi, float* out) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t stride = Kp * 2;  // bytes between rows of xb
  for (int64_t k = 0; k < Kp; k += kBlockK) {
    _tile_loadd(4, xb + k, stride);
    _tile_loadd(5, xb + 16 * Kp + k, stride);
    _tile_loadd(6, lo + k / 2 * kHalf, 64);
    _tile_loadd(7, hi + k / 2 * kHalf, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, kRows * 4);
  _tile_stored(1, out + kHalf, kRows * 4);
  _tile_stored(2, out + 16 * kRows, kRows * 4);
  _tile_stored(3, out + 16 * kRows + kHalf, kRows * 4);
}

// Linux hands out AMX's 8 KB of tile state only to a process that asks.
bool amx_permitted() {
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return __builtin_cpu_supports("avx512bf16") &&
         syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}
#endif

// x rounded to bf16, [round_up(M, 32), Kp], zero-padded: the calling thread's
// buffer, grown once to the largest prefill (no allocation per call). Used
// by the AMX and vdpbf16ps kernels only, which a CPU without them compiles out.
[[maybe_unused]] const uint16_t* to_bf16_rows(const float* x, int64_t ldx, int64_t M, int64_t K,
                                              int64_t Kp) {
  thread_local std::vector<uint16_t, Eigen::aligned_allocator<uint16_t>> buf;
  const int64_t Mp = round_up(M, 32);
  if (int64_t(buf.size()) < Mp * Kp) buf.resize(size_t(Mp * Kp));
  uint16_t* b = buf.data();
  parallel_chunks(Mp, grain_for(int64_t{1} << 15, Kp), [&](int64_t r0, int64_t r1) {
    for (int64_t m = r0; m < r1; ++m) {
      uint16_t* row = b + m * Kp;
      if (m >= M) {
        std::fill(row, row + Kp, uint16_t{0});
        continue;
      }
      for (int64_t k = 0; k < K; ++k) row[k] = float_to_bf16(x[m * ldx + k]);
      std::fill(row + K, row + Kp, uint16_t{0});
    }
  });
  return b;
}

}  // namespace

PrefillUnit best_prefill_unit() {
#if REDCO_PREFILL_AMX
  static const bool amx = amx_permitted();
  if (amx) return PrefillUnit::amx;
#endif
#if REDCO_PREFILL_DPBF16
  static const bool dp = __builtin_cpu_supports("avx512bf16");
  if (dp) return PrefillUnit::dpbf16;
#endif
  return PrefillUnit::none;
}

namespace {

// vdpbf16ps against the f32 chain on one layer-sized product (64 rows, 1024 x
// 1024): on Zen 4 bf16 dot products run at twice the f32 FMA rate, on Intel
// CPUs without AMX at about the same (this kernel then lost: 69 against 88
// tokens/s on a 1.1B prefill), so the CPU decides.
bool dpbf16_beats_chain() {
  constexpr int64_t M = 64, N = 1024, K = 1024;
  const std::vector<uint16_t> w(size_t(N * K), 0x3f80);  // 1.0, any layout
  const std::vector<float> x(size_t(M * K), 1.f);
  std::vector<float> y(size_t(M * N));
  const double dp = best_of_three([&] {
    prefill_matmul_panels(x.data(), K, w.data(), y.data(), N, M, N, K, PrefillUnit::dpbf16);
  });
  const double chain =
      best_of_three([&] { skinny_matmul_panels(x.data(), K, w.data(), y.data(), N, M, N, K); });
  return dp < chain;
}

}  // namespace

PrefillUnit prefill_unit() {
  static const PrefillUnit unit = [] {
    const char* env = std::getenv("REDCO_PREFILL");
    const std::string choice = env ? env : "";
    const PrefillUnit best = best_prefill_unit();
    if (choice.empty()) {
      if (best == PrefillUnit::dpbf16 && !dpbf16_beats_chain()) return PrefillUnit::none;
      return best;
    }
    REDCO_CHECK(choice == "chain" || choice == "dpbf16" || choice == "amx",
                "REDCO_PREFILL is '{}': use chain (f32 FMAs, every row count), dpbf16 "
                "(AVX512_BF16), amx, or leave it unset (the fastest this CPU has)",
                choice);
    const PrefillUnit want = choice == "chain"    ? PrefillUnit::none
                             : choice == "dpbf16" ? PrefillUnit::dpbf16
                                                  : PrefillUnit::amx;
    REDCO_CHECK(want <= best,
                "REDCO_PREFILL={}: this CPU or build has no such unit (it has {}); leave "
                "REDCO_PREFILL unset",
                choice,
                best == PrefillUnit::amx      ? "amx"
                : best == PrefillUnit::dpbf16 ? "dpbf16"
                                              : "neither");
    return want;
  }();
  return unit;
}

namespace {

// The rows of x against N outputs that `repack(b, lo, hi)` gives in pairs of
// k, 32 outputs (block b) at a time; scale: per output, or null.
template <typename Repack>
void prefill_pairs(const float* x, int64_t ldx, int64_t M, int64_t N, int64_t K, PrefillUnit unit,
                   const Repack& repack, const float* scale, float* y, int64_t ldy) {
  REDCO_CHECK(unit != PrefillUnit::none && unit <= best_prefill_unit(),
              "prefill on bf16 units: this CPU or build has no such unit");
  if (M == 0 || N == 0) return;
#if REDCO_PREFILL_DPBF16
  const int64_t Kp = round_up(K, kBlockK);
  const uint16_t* xb = to_bf16_rows(x, ldx, M, K, Kp);
  const int64_t n_blocks = (N + kRows - 1) / kRows;
  // A task: a block or more, so its repacking is paid once for every row.
  const int64_t grain = grain_for(int64_t{1} << 22, 2 * M * K * kRows);
  parallel_chunks(n_blocks, grain, [&](int64_t b, int64_t e) {
    thread_local Words lo, hi;
    if (int64_t(lo.size()) < Kp / 2 * kHalf) {
      lo.resize(size_t(Kp / 2 * kHalf));
      hi.resize(size_t(Kp / 2 * kHalf));
    }
    alignas(64) float block[32 * kRows];
#if REDCO_PREFILL_AMX
    static const TileConfig config;
    if (unit == PrefillUnit::amx) _tile_loadconfig(&config);
#endif
    for (int64_t bi = b; bi < e; ++bi) {
      repack(bi, Kp, lo.data(), hi.data());
      const int64_t n0 = bi * kRows, valid = std::min(kRows, N - n0);
      if (unit == PrefillUnit::dpbf16) {
        dp_panel(reinterpret_cast<const uint32_t*>(xb), Kp / 2, M, lo.data(), hi.data(), Kp / 2,
                 block, y, ldy, n0, valid, scale);
        continue;
      }
#if REDCO_PREFILL_AMX
      for (int64_t m = 0; m < round_up(M, 32); m += 32) {
        amx_block(xb + m * Kp, Kp, lo.data(), hi.data(), block);
        store_block(block, std::min<int64_t>(32, M - m), y + m * ldy, ldy, n0, valid, scale);
      }
#endif
    }
#if REDCO_PREFILL_AMX
    if (unit == PrefillUnit::amx) _tile_release();
#endif
  });
#else
  (void)x, (void)ldx, (void)repack, (void)scale, (void)y, (void)ldy, (void)K;
#endif
}

}  // namespace

void prefill_matmul_panels(const float* x, int64_t ldx, const uint16_t* packed, float* y,
                           int64_t ldy, int64_t M, int64_t N, int64_t K, PrefillUnit unit) {
  prefill_pairs(
      x, ldx, M, N, K, unit,
      [&](int64_t b, int64_t Kp, uint32_t* lo, uint32_t* hi) {
#if REDCO_PREFILL_DPBF16
        repack(packed + b * K * kRows, K, Kp, lo, hi);
#else
        (void)packed, (void)b, (void)Kp, (void)lo, (void)hi;
#endif
      },
      nullptr, y, ldy);
}

void prefill_matmul_i8_panels(const float* x, int64_t ldx, const int8_t* packed, const float* scale,
                              float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                              PrefillUnit unit) {
  static_assert(panels::i8::kRows == 2 * kRows, "an int8 panel is two 32-output blocks");
  prefill_pairs(
      x, ldx, M, N, K, unit,
      [&](int64_t b, int64_t Kp, uint32_t* lo, uint32_t* hi) {
#if REDCO_PREFILL_DPBF16
        repack_i8(packed + b / 2 * K * panels::i8::kRows, b % 2, K, Kp, lo, hi);
#else
        (void)packed, (void)b, (void)Kp, (void)lo, (void)hi;
#endif
      },
      scale, y, ldy);
}

}  // namespace redco::cpu
