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

namespace attnplan::io {

// float to binary16, to nearest (ties to even), for values in the half's normal range (about 6.1e-5 to
// 65504 in magnitude) and zero: what test and check code writes as F16 scales. Anything else is clamped
// into that range first, so the result is always a finite half.
inline constexpr std::uint16_t float_to_f16_normal(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const float magnitude = value < 0 ? -value : value;
  if (!(magnitude >= 0x1p-14f)) return sign;  // zero, subnormal range or NaN
  if (magnitude >= 65504.0f) return static_cast<std::uint16_t>(sign | 0x7bffu);
  const std::uint32_t magnitude_bits = bits & 0x7fffffffu;
  std::uint32_t exponent = (magnitude_bits >> 23) - 112u;  // re-bias 127 -> 15
  std::uint32_t mantissa = (magnitude_bits & 0x7fffffu) >> 13;
  const std::uint32_t rest = magnitude_bits & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (mantissa & 1u) != 0)) ++mantissa;
  if (mantissa == 0x400u) {
    mantissa = 0;
    ++exponent;
  }
  return static_cast<std::uint16_t>(sign | (exponent << 10) | mantissa);
}

}  // namespace attnplan::io
