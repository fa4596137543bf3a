// bfloat16 on the host, as raw 16-bit patterns (the top half of an IEEE float). Host code never does
// arithmetic in bf16: values are converted to float/double, computed, and rounded back once.
// Used by the CLI and the plan (to fill inputs and read outputs) and by the CPU reference and tests.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace attnplan::core {

inline constexpr float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// Round to nearest, ties to even, as __float2bfloat16 does on the device. NaN stays NaN (quieted, sign
// kept): the rounding carry would otherwise turn a NaN with only low payload bits into infinity.
// Overflow rounds to infinity, denormals round like any other value.
inline constexpr std::uint16_t float_to_bf16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  const std::uint32_t lowest_kept_bit = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7fffu + lowest_kept_bit) >> 16);
}

// Rounds a double straight to bf16 (ties to even), as if in one step. Going through a plain
// double -> float conversion would round twice and can miss by one unit: 1 + 2^-8 + 2^-40 must round up,
// but its nearest float is the tie 1 + 2^-8, which rounds down to even. So the float is taken rounded to
// odd (truncated, then its last bit set if anything was dropped), which keeps the information that
// decides the second rounding.
inline std::uint16_t double_to_bf16(double value) noexcept {
  if (std::isnan(value)) return float_to_bf16(static_cast<float>(value));
  float narrowed = static_cast<float>(value);  // nearest float, or +-inf beyond the float range
  if (std::isinf(narrowed) && !std::isinf(value))
    narrowed = std::copysign(std::numeric_limits<float>::max(), narrowed);
  if (std::fabs(static_cast<double>(narrowed)) > std::fabs(value)) {
    narrowed = std::nextafter(narrowed, 0.0f);  // truncate toward zero
  }
  if (static_cast<double>(narrowed) != value) {
    narrowed = std::bit_cast<float>(std::bit_cast<std::uint32_t>(narrowed) | 1u);  // sticky bit
  }
  return float_to_bf16(narrowed);
}

inline std::vector<std::uint16_t> floats_to_bf16(std::span<const float> values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
  return bits;
}

inline std::vector<float> bf16_to_floats(std::span<const std::uint16_t> bits) {
  std::vector<float> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_float(bits[i]);
  return values;
}

// Exact, as the CPU reference and the checks read bf16 data.
inline std::vector<double> bf16_to_doubles(std::span<const std::uint16_t> bits) {
  std::vector<double> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_float(bits[i]);
  return values;
}

}  // namespace attnplan::core
