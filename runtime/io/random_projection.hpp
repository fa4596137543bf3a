// Random projection weights in any format (io/projection_format.hpp): packed data as random bytes, scales
// in a sane range so the dequantized weights have about the asked magnitude, no NaN. For tests and
// `attnplan verify` (check/layer_check.cpp), never for inference.
#pragma once

#include <cstdint>

#include "config/attention_config.hpp"
#include "io/layer_weights.hpp"

namespace attnplan::io {

struct RandomProjection {
  HostTensor weight;  // the weight role as the checkpoint stores it
  QuantizationTensors quant;
};

// W [n, k] in `encoding`, dequantized entries of typical magnitude about `magnitude`, from `seed`.
// GPTQ act order gets a shuffled g_idx (each group still holds group_size rows of K); affine scales are
// negative for about half the groups. Shapes must satisfy projection_tensor_rules (same errors).
RandomProjection random_projection(const config::WeightEncoding& encoding, std::int64_t n, std::int64_t k,
                                   double magnitude, std::uint64_t seed);

}  // namespace attnplan::io
