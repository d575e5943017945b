#include "redco/core/dtype.hpp"

namespace redco {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::i8:
      return "i8";
  }
  return "?";
}

namespace {
thread_local Precision t_precision = Precision::f32;
}  // namespace

Precision matmul_precision() { return t_precision; }

std::string_view precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "f32"; }

PrecisionGuard::PrecisionGuard(Precision p) : previous_(t_precision) { t_precision = p; }
PrecisionGuard::~PrecisionGuard() { t_precision = previous_; }

uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (mag >= 0x47800000u) return uint16_t(sign | 0x7c00u);  // overflow -> inf (65520 rounds up)
  if (mag < 0x38800000u) {  // result is subnormal (or zero): shift the implicit-1 mantissa
    const int shift = 126 - int(mag >> 23);  // 14 + (113 - exp)
    if (shift > 24) return uint16_t(sign);
    const uint32_t mant = (mag & 0x7fffffu) | 0x800000u;
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  // normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits
  uint32_t r = mag - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0x1f)
    out = sign | 0x7f800000u | (mant << 13);
  else if (exp != 0)
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  else if (mant == 0)
    out = sign;
  else {  // subnormal: normalise
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while (!(m & 0x400u));
    out = sign | uint32_t(112 - e) << 23 | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace redco
