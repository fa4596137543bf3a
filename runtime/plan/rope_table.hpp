// The RoPE frequency table the plan uploads once at load (spec section 4): f_i for pair i in [0, R/2),
// after the config's scaling, in double, and the factor that multiplies cos and sin. Host-side code of
// the kernels, written apart from the CPU reference so that the reference stays an independent check.
#pragma once

#include <vector>

#include "config/attention_config.hpp"

namespace attnplan::plan {

struct RopeTable {
  std::vector<double> frequencies;  // [rotary_dim / 2], radians per position
  double attention_factor = 1.0;    // yarn's attention_factor; 1 for the other scalings
};

RopeTable rope_table(const config::AttentionConfig& config);

}  // namespace attnplan::plan
