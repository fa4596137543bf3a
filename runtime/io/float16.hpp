// IEEE 754 binary16 ("half", safetensors "F16") to float. Every half is exactly a float, so the
// conversion never rounds; checkpoints store some norm weights and biases this way.
#pragma once

#include <bit>
#include <cstdint>

namespace attnplan::io {

// 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. Infinities stay infinite and NaNs keep their
// payload (moved to the top of the float's mantissa, so a quiet NaN stays quiet).
inline constexpr float f16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24. Normal in float, and the product is exact.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  // A normal half is a normal float: re-bias the exponent (127 - 15 = 112), widen the mantissa.
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace attnplan::io
