// fp8 e4m3fn (OCP "E4M3", the `float8_e4m3fn` of PyTorch and safetensors' F8_E4M3) on the host, as raw
// 8-bit codes: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; 0x7F and 0xFF are
// NaN; the largest finite magnitude is 448 (0x7E); subnormals are m * 2^-9 for exponent field 0.
// Used by the CPU reference (fp8 KV cache) and the tests; the kernels convert with cuda_fp8.h, which rounds
// the same way (kv_store.cuh).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace attnplan::core {

inline constexpr double kFp8E4m3Max = 448.0;

// Exact: every code is a double (and a float, and a bf16). NaN codes give a quiet NaN.
inline double fp8_e4m3_to_double(std::uint8_t code) noexcept {
  const int exponent_field = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  const double sign = (code & 0x80) != 0 ? -1.0 : 1.0;
  if (exponent_field == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exponent_field == 0) return sign * std::ldexp(static_cast<double>(mantissa), -9);
  return sign * std::ldexp(8.0 + mantissa, exponent_field - 7 - 3);
}

// An fp8 KV pool as the reference reads it: code * scale per element (a NaN code, a poisoned slot, stays
// NaN).
inline std::vector<double> fp8_e4m3_to_doubles(std::span<const std::uint8_t> codes, double scale) {
  std::vector<double> values(codes.size());
  for (std::size_t i = 0; i < codes.size(); ++i) values[i] = fp8_e4m3_to_double(codes[i]) * scale;
  return values;
}

// Round to nearest, ties to even, saturating: every finite or infinite magnitude that rounds above 448
// becomes +-448 (the rounding mode `satfinite` of PTX cvt and of __nv_cvt_float_to_fp8 with
// __NV_SATFINITE); NaN becomes 0x7F. Magnitudes at or below 2^-10 (half the smallest subnormal; the tie
// goes to even, zero) become a zero of the value's sign. The conversion is one rounding of the exact
// value: a float argument widens to double exactly.
inline std::uint8_t double_to_fp8_e4m3(double value) noexcept {
  if (std::isnan(value)) return 0x7F;
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double magnitude = std::fabs(value);
  // Everything from 448 up saturates: (448, 464) rounds to 448, the tie 464 goes to the even 448, and
  // beyond that a non-saturating conversion would give NaN (e4m3fn has no infinity).
  if (magnitude >= kFp8E4m3Max) return static_cast<std::uint8_t>(sign | 0x7E);
  if (magnitude == 0.0) return sign;
  // The spacing of representable values around `magnitude`: 2^-9 below the smallest normal 2^-6 (the
  // subnormal step, also the step of [2^-6, 2^-5)), else 2^(e - 3) for magnitude in [2^e, 2^(e + 1)).
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  const int step_exponent = std::max(exponent - 1, -6) - 3;
  const double steps = std::ldexp(magnitude, -step_exponent);  // exact: a power-of-two scaling
  double rounded = std::floor(steps);
  const double fraction = steps - rounded;
  if (fraction > 0.5 || (fraction == 0.5 && std::fmod(rounded, 2.0) != 0.0)) rounded += 1.0;
  // rounded * 2^step_exponent is the result; encode it. Below 2^-6 (step 2^-9) the code is the step count
  // itself, and 8 steps (2^-6) is also the code of the smallest normal, so one formula covers both.
  if (step_exponent == -9) return static_cast<std::uint8_t>(sign | static_cast<int>(rounded));
  // Normal: rounded in [8, 16]; 16 carries into the next binade (never past 448: handled above).
  int exponent_field = step_exponent + 3 + 7;
  int mantissa = static_cast<int>(rounded) - 8;
  if (mantissa == 8) {
    mantissa = 0;
    exponent_field += 1;
  }
  return static_cast<std::uint8_t>(sign | (exponent_field << 3) | mantissa);
}

inline std::uint8_t float_to_fp8_e4m3(float value) noexcept {
  return double_to_fp8_e4m3(static_cast<double>(value));
}

// The fp8 KV cache's quantization (specs/formats.md): the stored code of a bf16 element x with per-tensor
// scale s is fp8(x / s), the quotient computed in fp32 (one IEEE rounding, as the kernel's __fdiv_rn) and
// then rounded to e4m3fn as above. Reading gives code * s.
inline std::uint8_t quantize_kv_fp8(float value, float scale) noexcept {
  return float_to_fp8_e4m3(value / scale);
}

}  // namespace attnplan::core
