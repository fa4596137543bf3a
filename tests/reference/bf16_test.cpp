// bf16 rounding vectors, written as bit patterns so each expectation can be checked by hand:
// the kept half is the top 16 bits of the float; the dropped half decides the rounding.
#include "core/bf16.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "reference/bf16.hpp"
#include "support/catch.hpp"

using attnplan::core::bf16_to_float;
using attnplan::core::double_to_bf16;
using attnplan::core::float_to_bf16;

namespace {

float from_bits(std::uint32_t bits) {
  return std::bit_cast<float>(bits);
}

}  // namespace

TEST_CASE("exact values convert both ways", "[bf16]") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-1.0f) == 0xbf80);
  CHECK(float_to_bf16(0.0f) == 0x0000);
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(bf16_to_float(0xc040) == -3.0f);
  CHECK(bf16_to_float(0x7f7f) == from_bits(0x7f7f0000u));  // largest finite bf16, about 3.39e38
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {   // every non-NaN pattern survives a round trip
    const float value = bf16_to_float(static_cast<std::uint16_t>(bits));
    if (!std::isnan(value)) REQUIRE(float_to_bf16(value) == bits);
  }
}

TEST_CASE("rounding to nearest", "[bf16]") {
  // 1/3 = 0x3eaaaaab: dropped 0xaaab > 0x8000, rounds up.
  CHECK(float_to_bf16(1.0f / 3.0f) == 0x3eab);
  // dropped 0x7fff < half: rounds down.
  CHECK(float_to_bf16(from_bits(0x3f807fffu)) == 0x3f80);
  // FLT_MAX = 0x7f7fffff rounds past the largest bf16 to infinity, as on the device.
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::max()) == 0xff80);
  // Just below the midpoint between the largest bf16 and 2^128 stays finite.
  CHECK(float_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f);
}

TEST_CASE("ties go to even", "[bf16]") {
  CHECK(float_to_bf16(from_bits(0x3f808000u)) == 0x3f80);  // kept 0x3f80 is even: stays
  CHECK(float_to_bf16(from_bits(0x3f818000u)) == 0x3f82);  // kept 0x3f81 is odd: up to even
  CHECK(float_to_bf16(from_bits(0xbf818000u)) == 0xbf82);  // the sign does not matter
  CHECK(float_to_bf16(from_bits(0x3f808001u)) == 0x3f81);  // above the tie: up
}

TEST_CASE("denormals round like any other value", "[bf16]") {
  CHECK(float_to_bf16(from_bits(0x00012345u)) == 0x0001);
  CHECK(float_to_bf16(from_bits(0x0000c000u)) == 0x0001);  // above half of the smallest bf16 denormal
  CHECK(float_to_bf16(from_bits(0x00008000u)) == 0x0000);  // exactly half: tie to even (zero)
  CHECK(float_to_bf16(from_bits(0x00018000u)) == 0x0002);  // tie from odd: up
  CHECK(float_to_bf16(from_bits(0x007fffffu)) ==
        0x0080);  // largest float denormal rounds to the smallest normal
  CHECK(bf16_to_float(0x0001) == from_bits(0x00010000u));
}

TEST_CASE("NaN stays NaN", "[bf16]") {
  CHECK(float_to_bf16(std::numeric_limits<float>::quiet_NaN()) == 0x7fc0);
  CHECK(float_to_bf16(from_bits(0xffc00000u)) == 0xffc0);  // sign kept
  // Payload only in the dropped bits: plain rounding would carry into infinity (0x7f80).
  CHECK(float_to_bf16(from_bits(0x7f800001u)) == 0x7fc0);
  CHECK(float_to_bf16(from_bits(0x7fffffffu)) == 0x7fff);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001u)))));
  CHECK(std::isnan(bf16_to_float(double_to_bf16(std::numeric_limits<double>::quiet_NaN()))));
}

TEST_CASE("doubles round once, not through a float", "[bf16]") {
  CHECK(double_to_bf16(1.0) == 0x3f80);
  CHECK(double_to_bf16(1.0 / 3.0) == 0x3eab);
  // 1 + 2^-8 is the tie between 0x3f80 and 0x3f81; 2^-40 more must round up. The nearest float to it
  // is the tie itself, so double -> float -> bf16 would give 0x3f80.
  const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  CHECK(float_to_bf16(static_cast<float>(above_tie)) == 0x3f80);
  CHECK(double_to_bf16(above_tie) == 0x3f81);
  CHECK(double_to_bf16(-above_tie) == 0xbf81);
  CHECK(double_to_bf16(1.0 + std::ldexp(1.0, -8)) == 0x3f80);                         // the tie itself: even
  CHECK(double_to_bf16(1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -40)) == 0x3f80);  // below: down
  CHECK(double_to_bf16(1e300) == 0x7f80);
  CHECK(double_to_bf16(-1e300) == 0xff80);
  CHECK(double_to_bf16(static_cast<double>(std::numeric_limits<float>::max())) == 0x7f80);
  CHECK(double_to_bf16(static_cast<double>(from_bits(0x7f7f0000u))) == 0x7f7f);
  CHECK(double_to_bf16(1e-300) == 0x0000);
  CHECK(double_to_bf16(-1e-300) == 0x8000);
  CHECK(double_to_bf16(std::ldexp(1.0, -133)) == 0x0001);  // the smallest bf16 denormal
  CHECK(double_to_bf16(std::ldexp(1.0, -134) + std::ldexp(1.0, -160)) == 0x0001);  // just above its half
  CHECK(double_to_bf16(std::numeric_limits<double>::infinity()) == 0x7f80);
}

TEST_CASE("tensors move to and from bf16", "[bf16][reference]") {
  using attnplan::reference::Tensor;
  const std::vector<std::uint16_t> bits{0x3f80, 0xc000, 0x3eab, 0x0000};
  const Tensor tensor = attnplan::reference::tensor_from_bf16(bits, {2, 2});
  CHECK(tensor.shape == std::vector<std::int64_t>{2, 2});
  CHECK(tensor(0, 0) == 1.0);
  CHECK(tensor(0, 1) == -2.0);
  CHECK(tensor(1, 0) == static_cast<double>(bf16_to_float(0x3eab)));
  CHECK(attnplan::reference::tensor_to_bf16(tensor) == bits);

  const Tensor rounded = attnplan::reference::round_to_bf16(Tensor({3}, {1.0 / 3.0, 1.0, -1e300}));
  CHECK(rounded.data[0] == static_cast<double>(bf16_to_float(0x3eab)));
  CHECK(rounded.data[1] == 1.0);
  CHECK(std::isinf(rounded.data[2]));
}
