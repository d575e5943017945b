#pragma once
// Rotary position embeddings (Su et al., 2021) as the checkpoints in the wild
// configure them, "rotate half" pairing (dimension i with i + rotary_dim/2):
//  * base (rope_theta);
//  * scaling of the frequencies: none, linear (positions / factor) and
//    LLaMA 3's (long wavelengths divided by factor, short ones kept, a smooth
//    ramp between, from original_max_position_embeddings);
//  * partial rotary: only the first rotary_dim dimensions of a head rotate
//    (GPT-NeoX's rotary_pct, GPT-J's rotary_dim), the rest pass through.
// The plain case (no scaling, every dimension) runs the fused kernel; the
// others rotate with cos/sin tables through differentiable ops, which gives
// the same numbers as the kernel for the plain case (tested).
#include <cstdint>
#include <span>
#include <vector>

#include "redco/autodiff/functional.hpp"

namespace redco::nn {

enum class RopeScaling : uint8_t { none, linear, llama3 };

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct RopeOptions {
  float base = 10000.f;
  int64_t rotary_dim = 0;  // 0: the whole head
  RopeScaling scaling = RopeScaling::none;
  float factor = 1.f;
  float low_freq_factor = 1.f;            // llama3
  float high_freq_factor = 4.f;           // llama3
  int64_t original_max_positions = 8192;  // llama3
};

// The rotation frequencies [rotary_dim / 2] of head size `head_dim`, in double.
std::vector<double> rope_inv_freq(const RopeOptions& o, int64_t head_dim);

// x [B, H, T, D] rotated at positions pos_offset .. pos_offset + T - 1.
Tensor apply_rope(const Tensor& x, int64_t pos_offset, const RopeOptions& o);

// For generation (no gradient): cos/sin of batch row b at positions
// start[b] .. start[b] + T - 1, then q and k rotated with the same table.
struct RopeTable {
  int64_t B = 0, T = 0, half = 0;
  std::vector<float> cos, sin;  // [B, T, half]
};
void fill_rope_table(RopeTable& table, std::span<const int64_t> start, int64_t T, int64_t head_dim,
                     const RopeOptions& o);
Tensor apply_rope_table(const Tensor& x, const RopeTable& table);

}  // namespace redco::nn
