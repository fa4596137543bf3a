// Weight encodings the quantized GEMM tests build by value (header-only: the plan and GPU tests share it).
#pragma once

#include <vector>

#include "config/attention_config.hpp"

namespace attnplan::testing {

inline config::WeightEncoding packed_encoding(config::PackedIntegerScheme scheme, int bits, int group_size,
                                              bool act_order) {
  config::WeightEncoding result;
  result.format = config::WeightFormat::packed_integer;
  result.scheme = scheme;
  result.bits = bits;
  result.group_size = group_size;
  result.act_order = act_order;
  return result;
}

inline config::WeightEncoding affine_encoding(int bits, int group_size) {
  config::WeightEncoding result;
  result.format = config::WeightFormat::affine;
  result.bits = bits;
  result.group_size = group_size;
  return result;
}

// fp8 e4m3fn weights with bf16 activations (weight-only) at one scale granularity.
inline config::WeightEncoding fp8_weight_only(config::Fp8ScaleGranularity granularity) {
  config::WeightEncoding result;
  result.format = config::WeightFormat::fp8;
  result.scale_granularity = granularity;
  result.activation = config::ActivationType::bf16;
  return result;
}

// The 8-bit formats the sm_90a mixed-input kernel reads: fp8 weight-only per tensor, channel and 128 x 128
// block, and mxfp8.
inline std::vector<config::WeightEncoding> sm90_w8_encodings() {
  std::vector<config::WeightEncoding> encodings;
  for (const auto granularity : {config::Fp8ScaleGranularity::tensor, config::Fp8ScaleGranularity::channel,
                                 config::Fp8ScaleGranularity::block})
    encodings.push_back(fp8_weight_only(granularity));
  config::WeightEncoding mxfp8;
  mxfp8.format = config::WeightFormat::mxfp8;
  encodings.push_back(mxfp8);
  return encodings;
}

}  // namespace attnplan::testing
