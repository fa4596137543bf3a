// The fp8 activation rounding of the fp8-activation projection (templates/attnplan/gemm_sm90_fp8_params.h
// states the rule), done on the host from the same bf16 bits: per token, or per token and group of 128
// channels (config::Fp8ActivationScales), scale = amax / 448 in fp32 (1 when amax is 0), code = e4m3fn(a /
// scale) with the quotient in fp32 and core::float_to_fp8_e4m3's rounding (nearest even, saturating). The
// GPU's codes and scales must equal these bit for bit; the GEMM reference then multiplies code * scale
// exactly in double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "config/attention_config.hpp"
#include "reference/tensor.hpp"

namespace attnplan::reference {

struct Fp8Activations {
  int m = 0;
  int k = 0;
  int group = 128;                  // channels per scale: 128, or k (one scale per token)
  std::vector<std::uint8_t> codes;  // [m, k] e4m3fn
  std::vector<float> scales;        // [ceil(k / group), m]: group-major, as the kernels write them
};

// `bits`: bf16 [m, k], row-major. Throws Error(input) when the sizes disagree.
Fp8Activations quantize_activations_fp8(std::span<const std::uint16_t> bits, int m, int k,
                                        config::Fp8ActivationScales scales);

// A [m, k] as the fp8 GEMM reads it: code * scale, exact in double.
Tensor dequantize_activations_fp8(const Fp8Activations& activations);

}  // namespace attnplan::reference
