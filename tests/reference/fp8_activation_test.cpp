// The fp8 activation rounding rule of the reference (reference/fp8_activation.hpp) on known values.
#include <cstdint>
#include <vector>

#include "core/bf16.hpp"
#include "core/fp8.hpp"
#include "reference/fp8_activation.hpp"
#include "support/catch.hpp"

using namespace attnplan;

namespace {

constexpr int kChannels = 144;

// Two tokens of 144 channels (a 128-channel group and one of 16): token 0 is 1.0 with -896 at channel 5,
// then 0.5 with 3.0 at channel 130; token 1 is all zeros.
std::vector<std::uint16_t> two_tokens() {
  std::vector<std::uint16_t> bits(std::size_t(2) * kChannels, core::float_to_bf16(0.0f));
  for (int c = 0; c < 128; ++c) bits[c] = core::float_to_bf16(c == 5 ? -896.0f : 1.0f);
  for (int c = 128; c < kChannels; ++c) bits[c] = core::float_to_bf16(c == 130 ? 3.0f : 0.5f);
  return bits;
}

}  // namespace

TEST_CASE("fp8 activations: scale amax / 448 per token and 128 channels, codes RNE saturating",
          "[reference][fp8_activation]") {
  // Token 0: channels 0..143 (two groups, the second 16 wide); token 1: all zeros.
  const int m = 2, k = kChannels;
  const std::vector<std::uint16_t> bits = two_tokens();
  const reference::Fp8Activations quantized =
      reference::quantize_activations_fp8(bits, m, k, config::Fp8ActivationScales::token_group);
  REQUIRE(quantized.scales.size() == 4);        // [2 groups, 2 tokens]
  CHECK(quantized.scales[0] == 2.0f);           // token 0, group 0: 896 / 448
  CHECK(quantized.scales[1] == 1.0f);           // token 1, group 0: all zero
  CHECK(quantized.scales[2] == 3.0f / 448.0f);  // token 0, group 1
  CHECK(quantized.codes[5] == 0xFE);            // -448: the group's amax maps to the largest code
  CHECK(quantized.codes[0] == core::float_to_fp8_e4m3(0.5f));
  CHECK(quantized.codes[130] == 0x7E);
  CHECK(quantized.codes[131] == core::float_to_fp8_e4m3(0.5f / (3.0f / 448.0f)));
  CHECK(quantized.codes[k] == 0x00);
  const reference::Tensor a = reference::dequantize_activations_fp8(quantized);
  CHECK(a.data[5] == -896.0);
  CHECK(a.data[0] == 1.0);
  CHECK(a.data[130] == 448.0 * double(3.0f / 448.0f));
}

TEST_CASE("fp8 activations: one scale per token over all its channels", "[reference][fp8_activation]") {
  // Token 0's amax (-896) sits in its first 128 channels and scales its last 16 too; token 1 is all zeros.
  const int m = 2, k = kChannels;
  const std::vector<std::uint16_t> bits = two_tokens();
  const reference::Fp8Activations quantized =
      reference::quantize_activations_fp8(bits, m, k, config::Fp8ActivationScales::token);
  CHECK(quantized.group == k);
  REQUIRE(quantized.scales.size() == 2);  // [1 group, 2 tokens]
  CHECK(quantized.scales[0] == 2.0f);     // token 0: 896 / 448
  CHECK(quantized.scales[1] == 1.0f);     // token 1: all zero
  CHECK(quantized.codes[5] == 0xFE);      // -448
  CHECK(quantized.codes[0] == core::float_to_fp8_e4m3(0.5f));
  CHECK(quantized.codes[130] == core::float_to_fp8_e4m3(1.5f));  // 3 / 2, not the group's 448
  CHECK(quantized.codes[131] == core::float_to_fp8_e4m3(0.25f));
  CHECK(quantized.codes[k] == 0x00);
  const reference::Tensor a = reference::dequantize_activations_fp8(quantized);
  CHECK(a.data[5] == -896.0);
  CHECK(a.data[130] == 3.0);
  CHECK(a.data[131] == 0.5);
  CHECK(a.data[k + 7] == 0.0);
}

TEST_CASE("fp8 activations: the scales follow the weight scales' granularity",
          "[reference][fp8_activation]") {
  CHECK(config::fp8_activation_scales(config::Fp8ScaleGranularity::tensor) ==
        config::Fp8ActivationScales::token);
  CHECK(config::fp8_activation_scales(config::Fp8ScaleGranularity::channel) ==
        config::Fp8ActivationScales::token);
  CHECK(config::fp8_activation_scales(config::Fp8ScaleGranularity::block) ==
        config::Fp8ActivationScales::token_group);
}
