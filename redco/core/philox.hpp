#pragma once
// Philox-4x32-10 counter-based RNG (Salmon et al., SC'11) and the distributions
// redco draws from it. The value at flat index i of a tensor drawn with
// (seed, stream) depends only on (seed, stream, i): a shard that owns elements
// [offset, offset + n) draws exactly the values the unsharded tensor holds
// there, which is what makes initialisation and dropout independent of how a
// tensor is split across devices.
#include <array>
#include <cstdint>
#include <string_view>

namespace redco {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// The raw bijection: 10 rounds of Philox-4x32 on (counter, key).
constexpr PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(M0) * ctr[0];
    const uint64_t p1 = uint64_t(M1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1],
           uint32_t(p0)};
    key = {key[0] + W0, key[1] + W1};
  }
  return ctr;
}

// 32 random bits for flat index i of stream `stream` under `seed`:
// counter = (i / 4, stream), key = seed; lane i % 4 of the output block.
constexpr uint32_t philox_bits(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t block = i >> 2;
  const PhiloxCounter out = philox4x32_10(
      {uint32_t(block), uint32_t(block >> 32), uint32_t(stream), uint32_t(stream >> 32)},
      {uint32_t(seed), uint32_t(seed >> 32)});
  return out[i & 3];
}

// Fill out[0, n) with the values at flat indices [offset, offset + n).
// uniform: [lo, hi). normal: mean + std * N(0,1) (Box-Muller on the lane pairs
// (0,1) and (2,3) of a block, so each value still depends on its index alone).
// truncated_normal: N(mean, std) restricted to [mean + a*std, mean + b*std],
// by inverse CDF (no rejection, so still index-pure). bernoulli: 1 with
// probability p else 0.
void philox_uniform(float* out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset, float lo,
                    float hi);
void philox_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                   float mean, float std);
void philox_truncated_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                             float mean, float std, float a, float b);
void philox_bernoulli(uint8_t* out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                      float p);

// A stable 64-bit stream id from a name (FNV-1a), e.g. a parameter's dotted
// name, so "h.3.attn.q_proj.weight" is initialised the same way everywhere.
constexpr uint64_t stream_of(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace redco
