#include "core/fp8.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "support/catch.hpp"

using attnplan::core::double_to_fp8_e4m3;
using attnplan::core::float_to_fp8_e4m3;
using attnplan::core::fp8_e4m3_to_double;
using attnplan::core::quantize_kv_fp8;

namespace {

// The e4m3fn value of a code written out from the format's definition, independently of the decoder's
// formula: sign, 4-bit exponent with bias 7, 3-bit mantissa, exponent field 0 subnormal.
double by_definition(int code) {
  const int sign = code >> 7, exponent_field = (code >> 3) & 15, mantissa = code & 7;
  double magnitude = exponent_field == 0 ? mantissa / 8.0 * std::pow(2.0, -6)
                                         : (1.0 + mantissa / 8.0) * std::pow(2.0, exponent_field - 7);
  return sign != 0 ? -magnitude : magnitude;
}

}  // namespace

TEST_CASE("fp8 e4m3fn: every one of the 256 codes decodes to its defined value", "[fp8]") {
  for (int code = 0; code < 256; ++code) {
    INFO("code " << code);
    const double value = fp8_e4m3_to_double(static_cast<std::uint8_t>(code));
    if ((code & 0x7F) == 0x7F) {
      CHECK(std::isnan(value));
      continue;
    }
    CHECK(value == by_definition(code));
    CHECK(std::signbit(value) == ((code & 0x80) != 0));  // 0x80 is -0
  }
  CHECK(fp8_e4m3_to_double(0x01) == std::ldexp(1.0, -9));  // smallest subnormal
  CHECK(fp8_e4m3_to_double(0x07) == 7 * std::ldexp(1.0, -9));
  CHECK(fp8_e4m3_to_double(0x08) == std::ldexp(1.0, -6));  // smallest normal
  CHECK(fp8_e4m3_to_double(0x38) == 1.0);
  CHECK(fp8_e4m3_to_double(0x7E) == 448.0);
  CHECK(fp8_e4m3_to_double(0xFE) == -448.0);
}

TEST_CASE("fp8 e4m3fn: every finite code encodes back to itself, from double and from float", "[fp8]") {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    INFO("code " << code);
    const double value = fp8_e4m3_to_double(static_cast<std::uint8_t>(code));
    CHECK(double_to_fp8_e4m3(value) == code);
    CHECK(float_to_fp8_e4m3(static_cast<float>(value)) == code);
  }
}

TEST_CASE("fp8 e4m3fn: ties round to the even code, everything else to the nearest", "[fp8]") {
  // Every pair of neighbouring positive codes (subnormal, normal, across binades): the midpoint goes to the
  // even code, the doubles just beside it to the nearer one. Negative values mirror with the sign bit.
  for (int code = 0; code < 0x7E; ++code) {
    INFO("between codes " << code << " and " << code + 1);
    const double low = fp8_e4m3_to_double(static_cast<std::uint8_t>(code));
    const double high = fp8_e4m3_to_double(static_cast<std::uint8_t>(code + 1));
    const double middle = (low + high) / 2;  // exact in double
    const int even = code % 2 == 0 ? code : code + 1;
    CHECK(double_to_fp8_e4m3(middle) == even);
    CHECK(double_to_fp8_e4m3(-middle) == (0x80 | even));
    CHECK(double_to_fp8_e4m3(std::nextafter(middle, 0.0)) == code);
    CHECK(double_to_fp8_e4m3(std::nextafter(middle, 1e9)) == code + 1);
  }
  CHECK(double_to_fp8_e4m3(1.0625) == 0x38);  // 1 + 1/16: tie between 1 (even) and 1.125
  CHECK(double_to_fp8_e4m3(1.1875) == 0x3A);  // 1.125 + 1/16: tie between 1.125 and 1.25 (even)
  CHECK(double_to_fp8_e4m3(0.0625 * 1.03) == 0x18);
}

TEST_CASE("fp8 e4m3fn: subnormals, underflow and signed zero", "[fp8]") {
  const double step = std::ldexp(1.0, -9);
  CHECK(double_to_fp8_e4m3(0.0) == 0x00);
  CHECK(double_to_fp8_e4m3(-0.0) == 0x80);
  CHECK(double_to_fp8_e4m3(step / 2) == 0x00);  // tie with zero: even
  CHECK(double_to_fp8_e4m3(-step / 2) == 0x80);
  CHECK(double_to_fp8_e4m3(std::nextafter(step / 2, 1.0)) == 0x01);  // just above half a step
  CHECK(double_to_fp8_e4m3(1.5 * step) == 0x02);                     // tie 1 | 2: even
  CHECK(double_to_fp8_e4m3(2.5 * step) == 0x02);                     // tie 2 | 3: even
  CHECK(double_to_fp8_e4m3(7.5 * step) == 0x08);                     // tie 7 | 8 (smallest normal)
  CHECK(double_to_fp8_e4m3(1e-30) == 0x00);
  CHECK(double_to_fp8_e4m3(-1e-30) == 0x80);
  CHECK(double_to_fp8_e4m3(std::numeric_limits<double>::denorm_min()) == 0x00);
}

TEST_CASE("fp8 e4m3fn: overflow saturates to +-448, NaN is 0x7F", "[fp8]") {
  CHECK(double_to_fp8_e4m3(448.0) == 0x7E);
  CHECK(double_to_fp8_e4m3(449.0) == 0x7E);
  CHECK(double_to_fp8_e4m3(464.0) == 0x7E);  // the tie 448 | 480 (480 would be the NaN code)
  CHECK(double_to_fp8_e4m3(465.0) == 0x7E);
  CHECK(double_to_fp8_e4m3(1e30) == 0x7E);
  CHECK(double_to_fp8_e4m3(-1e30) == 0xFE);
  CHECK(double_to_fp8_e4m3(std::numeric_limits<double>::infinity()) == 0x7E);
  CHECK(double_to_fp8_e4m3(-std::numeric_limits<double>::infinity()) == 0xFE);
  CHECK(double_to_fp8_e4m3(std::numeric_limits<double>::quiet_NaN()) == 0x7F);
  CHECK(double_to_fp8_e4m3(-std::numeric_limits<double>::quiet_NaN()) == 0x7F);
  CHECK(float_to_fp8_e4m3(std::numeric_limits<float>::max()) == 0x7E);
}

TEST_CASE("fp8 KV quantization divides in fp32 before the one e4m3 rounding", "[fp8]") {
  CHECK(quantize_kv_fp8(1.0f, 1.0f) == 0x38);
  CHECK(quantize_kv_fp8(3.0f, 0.5f) == double_to_fp8_e4m3(6.0));
  CHECK(quantize_kv_fp8(-1000.0f, 1.0f) == 0xFE);  // saturates instead of turning into NaN
  CHECK(quantize_kv_fp8(1000.0f, 4.0f) == double_to_fp8_e4m3(250.0));
  // The quotient is the fp32 one: 0.1f / 0.3f rounds once to float, then to e4m3.
  CHECK(quantize_kv_fp8(0.1f, 0.3f) == double_to_fp8_e4m3(static_cast<double>(0.1f / 0.3f)));
}
