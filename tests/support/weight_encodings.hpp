// Weight encodings the quantized GEMM tests build by value (header-only: the plan and GPU tests share it).
#pragma once

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

}  // namespace attnplan::testing
