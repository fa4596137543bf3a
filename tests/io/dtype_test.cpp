// Dtype names and sizes as the safetensors format spells them, and the half -> float conversion the weight
// loader uses for F16 norms and biases (checked value by value and against the compiler's own _Float16).
#include "io/dtype.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "io/float16.hpp"
#include "support/catch.hpp"

using attnplan::io::Dtype;
using attnplan::io::dtype_from_name;
using attnplan::io::dtype_name_list;
using attnplan::io::element_size;
using attnplan::io::f16_to_float;

TEST_CASE("every dtype has the format's name and element size", "[io][dtype]") {
  struct Row {
    Dtype dtype;
    const char* name;
    std::size_t size;
  };
  const Row rows[] = {
      {Dtype::bf16, "BF16", 2},  {Dtype::f16, "F16", 2},         {Dtype::f32, "F32", 4},
      {Dtype::f64, "F64", 8},    {Dtype::f8_e4m3, "F8_E4M3", 1}, {Dtype::f8_e5m2, "F8_E5M2", 1},
      {Dtype::u8, "U8", 1},      {Dtype::i8, "I8", 1},           {Dtype::i16, "I16", 2},
      {Dtype::i32, "I32", 4},    {Dtype::u32, "U32", 4},         {Dtype::i64, "I64", 8},
      {Dtype::bool_, "BOOL", 1},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    CHECK(to_string(row.dtype) == row.name);
    CHECK(element_size(row.dtype) == row.size);
    REQUIRE(dtype_from_name(row.name).has_value());
    CHECK(*dtype_from_name(row.name) == row.dtype);
  }
  CHECK(dtype_name_list() == "BF16, F16, F32, F64, F8_E4M3, F8_E5M2, U8, I8, I16, I32, U32, I64, BOOL");
}

TEST_CASE("names are exact: other spellings and dtypes attnplan does not read are unknown", "[io][dtype]") {
  CHECK_FALSE(dtype_from_name("bf16").has_value());  // the format's names are upper case
  CHECK_FALSE(dtype_from_name("U16").has_value());   // in the format, not read here
  CHECK_FALSE(dtype_from_name("F8_E8M0").has_value());
  CHECK_FALSE(dtype_from_name("").has_value());
}

TEST_CASE("f16_to_float converts hand-checked bit patterns exactly", "[io][dtype]") {
  CHECK(f16_to_float(0x3c00) == 1.0f);
  CHECK(f16_to_float(0xc000) == -2.0f);
  CHECK(f16_to_float(0x3555) == 0x1.554p-2f);  // 0.333252, the half nearest 1/3
  CHECK(f16_to_float(0x7bff) == 65504.0f);     // largest finite half
  CHECK(f16_to_float(0x0400) == 0x1p-14f);     // smallest normal
  CHECK(f16_to_float(0x0001) == 0x1p-24f);     // smallest subnormal
  CHECK(f16_to_float(0x03ff) == 1023 * 0x1p-24f);
  CHECK(f16_to_float(0x0000) == 0.0f);
  CHECK(std::signbit(f16_to_float(0x8000)));
  CHECK(f16_to_float(0x8001) == -0x1p-24f);
  CHECK(f16_to_float(0x7c00) == std::numeric_limits<float>::infinity());
  CHECK(f16_to_float(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(f16_to_float(0x7e00)));
  CHECK(std::isnan(f16_to_float(0x7c01)));  // a signalling NaN must not become infinity
  CHECK(std::bit_cast<std::uint32_t>(f16_to_float(0xfe00)) == 0xffc00000u);
}

TEST_CASE("f16_to_float matches the definition of binary16 for all 65536 patterns", "[io][dtype]") {
  // (-1)^s * 2^(e - 15) * (1 + m / 1024) for normals, 2^-14 * m / 1024 for subnormals: arithmetic, not bits.
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const int sign = (bits >> 15) != 0 ? -1 : 1;
    const int exponent = static_cast<int>((bits >> 10) & 0x1f);
    const int mantissa = static_cast<int>(bits & 0x3ff);
    const float converted = f16_to_float(static_cast<std::uint16_t>(bits));
    if (exponent == 31) {
      CHECK((mantissa == 0 ? std::isinf(converted) : std::isnan(converted)));
      continue;
    }
    const double expected = exponent == 0 ? sign * std::ldexp(mantissa, -24)
                                          : sign * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
    if (static_cast<double>(converted) != expected)
      FAIL("pattern " << bits << ": " << converted << " != " << expected);
  }
}

#if defined(__FLT16_MAX__)
TEST_CASE("f16_to_float agrees with the compiler's _Float16", "[io][dtype]") {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float native = static_cast<float>(std::bit_cast<_Float16>(static_cast<std::uint16_t>(bits)));
    const float converted = f16_to_float(static_cast<std::uint16_t>(bits));
    const bool same = std::isnan(native)
                          ? std::isnan(converted)
                          : std::bit_cast<std::uint32_t>(native) == std::bit_cast<std::uint32_t>(converted);
    if (!same) FAIL("pattern " << bits);
  }
}
#endif
