#pragma once
// Where each element of a weight packed for decoding lives (pack_panels and
// pack_panels_i8, redco/ops/cpu/decode_panels.hpp). The one source of these
// layouts: the packers, the decode kernels (ops/cpu/skinny_panels.cpp,
// skinny_i8_panels.cpp), the prefill repacking, the unpacking conversions and
// the embedding gathers all index through it.
//
// A weight [N, K] (N outputs, K inputs) is cut into panels of kRows
// consecutive rows; a panel stores its K columns one after another, each
// column its kRows weights in 64 bytes (one cache line). A decode step then
// reads the whole matrix as one straight stream and, per column, widens one
// cache line into 32 outputs' weights and multiplies them by one broadcast
// activation per row: every FMA does useful work with no activation vector
// load and no horizontal sum, which is what the row-major kernel spends half
// its issue slots on at a batch of 8 (measured on AVX-512: 153 against 109
// GFLOP/s a core with the data in cache).
//
// Within a column the two 16-bit halves of 32-bit lane j hold outputs j and
// j + 16, so one shift widens the low halves to outputs 0-15 and one AND the
// high halves to outputs 16-31, in order. The last panel is padded with zero
// rows up to kRows.
#include <cstdint>

namespace redco::panels {

inline constexpr int64_t kRows = 32;

// Rows of storage an [N, K] weight takes (N rounded up to whole panels).
constexpr int64_t padded_rows(int64_t n) { return (n + kRows - 1) / kRows * kRows; }

// The position of output i (0 <= i < kRows) within its column of 32.
constexpr int64_t slot(int64_t i) { return i < kRows / 2 ? 2 * i : 2 * (i - kRows / 2) + 1; }

// Element (n, k) of an [N, K] weight, counted in bf16 values from the start.
constexpr int64_t index(int64_t n, int64_t k, int64_t K) {
  return (n / kRows * K + k) * kRows + slot(n % kRows);
}

}  // namespace redco::panels

// Int8 weights packed for decoding (pack_panels_i8): panels of kRows
// consecutive rows (outputs), each column their kRows int8 weights in one
// cache line, output i at byte i (one sign extension widens 16 consecutive
// outputs to f32 lanes in order). The last panel is padded with zero rows.
namespace redco::panels::i8 {

inline constexpr int64_t kRows = 64;

// Rows of storage an [N, K] weight takes (N rounded up to whole panels).
constexpr int64_t padded_rows(int64_t n) { return (n + kRows - 1) / kRows * kRows; }

// Element (n, k) of an [N, K] weight, counted in bytes from the start.
constexpr int64_t index(int64_t n, int64_t k, int64_t K) {
  return (n / kRows * K + k) * kRows + n % kRows;
}

}  // namespace redco::panels::i8
