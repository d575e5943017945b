#pragma once
// The randomness a user function sees: a small value naming one Philox
// stream. Every number drawn from it depends only on (seed, step, stream), so
// a training step, a prediction batch or a resumed run draws exactly what the
// uninterrupted run drew, whatever the thread, device or process that runs it.
//
//   auto loss = [](auto& model, const Batch& b, Rng rng) {
//     Tensor noise = rng.normal(b.x.shape());       // fresh per step
//     Tensor mask = rng.split(1).uniform({8}, 0, 1);  // an independent stream
//     ...
//   };
#include <cstdint>
#include <string_view>

#include "redco/core/philox.hpp"
#include "redco/core/tensor.hpp"

namespace redco::train {

// Stream ids the library itself uses, apart from anything a user derives.
enum class Purpose : uint64_t { train = 1, eval = 2, predict = 3, shuffle = 4, examples = 5 };

struct Rng {
  uint64_t seed = 0;    // the run's seed (Deployer)
  uint64_t step = 0;    // the training step, or the prediction batch
  uint64_t stream = 0;  // which of the independent streams of that step

  // A child stream: rng.split(i) for i = 0, 1, ... are independent of each
  // other and of `rng` itself, and the same on every call.
  constexpr Rng split(uint64_t i) const {
    return {seed, step, mix(stream ^ 0x9E3779B97F4A7C15ull, i)};
  }
  constexpr Rng split(std::string_view name) const { return split(stream_of(name)); }

  // The (key, stream) pair Philox kernels take: seed() and stream_id().
  constexpr uint64_t key() const { return mix(seed, step); }
  constexpr uint64_t stream_id() const { return stream; }
  constexpr PhiloxKey philox_key() const {
    const uint64_t k = key();
    return {uint32_t(k), uint32_t(k >> 32)};
  }
  // 32 random bits at index i of this stream.
  constexpr uint32_t bits(uint64_t i) const { return philox_bits(key(), stream, i); }
  // A uniform double in [0, 1) from index i (53 random bits).
  constexpr double uniform01(uint64_t i) const {
    const uint64_t hi = bits(2 * i), lo = bits(2 * i + 1);
    return double(((hi << 32) | lo) >> 11) * 0x1.0p-53;
  }

  Tensor uniform(const Shape& shape, float lo = 0.f, float hi = 1.f) const {
    return Tensor::uniform(shape, key(), stream, lo, hi);
  }
  Tensor normal(const Shape& shape, float mean = 0.f, float std = 1.f) const {
    return Tensor::normal(shape, key(), stream, mean, std);
  }

  friend constexpr bool operator==(const Rng&, const Rng&) = default;

 private:
  // SplitMix64 finaliser over a combination: a cheap, well-mixed 64-bit hash
  // so nearby (seed, step) pairs give unrelated Philox keys.
  static constexpr uint64_t mix(uint64_t a, uint64_t b) {
    uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

}  // namespace redco::train
