#pragma once
// Element types and the reduced-precision conversions. bf16/f16 are storage
// formats: kernels compute in f32 and convert at the edges.
#include <cstdint>
#include <cstring>
#include <string_view>

namespace redco {

// i8: int8 weights quantized by rows (quantize_rows), for inference.
enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8, i8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
    case DType::i8:
      return 1;
  }
  return 0;
}
std::string_view dtype_name(DType t);
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::i8;
}

// bf16 = the top 16 bits of an f32; round to nearest even, NaN stays NaN
// (made quiet). Branch-free, so a loop over it vectorises.
inline uint16_t float_bits_to_bf16(uint32_t u) {
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return float_bits_to_bf16(u);
}
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Mixed precision: the compute type of matrix products (linear, matmul,
// attention projections). Under Precision::bf16 their operands are rounded to
// bf16 and products accumulate and land in f32, so parameters, gradients and
// optimizer state stay f32 (master weights); everything else (norms,
// softmax, losses, optimizer) computes in f32 as always. Two activations
// that only feed products are kept for backward in bf16, half their bytes:
// attention's q, k and v (its score and output products read them rounded),
// and the fused MLP's hidden pre-activation (bias_gelu_linear: fc1's output,
// rounded as a bf16 GEMM's output would be, for forward and backward alike).
//
//   { PrecisionGuard mixed(Precision::bf16); loss = loss_fn(params); }
//
// The setting is per thread, like a grad mode. A differentiable matmul
// remembers the precision it ran under, so its backward products use the same
// one even though backward runs after the guard has closed.
enum class Precision : uint8_t { f32, bf16 };
Precision matmul_precision();  // this thread's current setting (f32 by default)
std::string_view precision_name(Precision p);

class PrecisionGuard {
 public:
  explicit PrecisionGuard(Precision p);
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;
  ~PrecisionGuard();

 private:
  Precision previous_;
};

// IEEE binary16 (round to nearest even; overflow -> inf; subnormals kept).
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

}  // namespace redco
