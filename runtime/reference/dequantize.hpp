// Reference dequantization of every projection weight format (specs/formats.md) to double W [N, K], from
// the checkpoint's bytes by its own decoders (never the kernels' code), so the GPU's dequantization is
// checked against an independent reading of the format.
#pragma once

#include <cstdint>
#include <span>

#include "config/attention_config.hpp"
#include "io/layer_weights.hpp"
#include "reference/tensor.hpp"

namespace attnplan::reference {

// OCP E8M0 scale: 2^(e - 127); e = 0xFF is NaN.
double e8m0_value(std::uint8_t e);
// OCP E2M1 from the low 4 bits: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign.
double e2m1_value(std::uint8_t nibble);
// float8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN, exponent 0 is subnormal (m / 8 * 2^-6).
double e4m3fn_value(std::uint8_t byte);
// Value `index` of width `bits` of an LSB-first bit stream over little-endian bytes (MLX affine).
std::uint32_t stream_bits(std::span<const std::uint8_t> stream, std::int64_t index, int bits);

// W [n, k] of one projection: `weight` and `quant` as io::load_layer_weights returns them. Error(input)
// when a tensor is missing or its byte count does not fit the format.
Tensor dequantize(const config::WeightEncoding& encoding, const io::HostTensor& weight,
                  const io::QuantizationTensors& quant, std::int64_t n, std::int64_t k);

}  // namespace attnplan::reference
