// RMSNorm over the last dimension (spec section 1 for the input norm, section 3 for the per-head norms).
#pragma once

#include <span>

#include "reference/tensor.hpp"

namespace attnplan::reference {

// For each row r of input [..., n]:
//   output[r][i] = input[r][i] / sqrt(mean_j(input[r][j]^2) + epsilon) * (weight[i] + weight_offset)
// in double precision, unrounded. `weight` is [n], or empty for a norm without weight (Gemma 3n's v norm),
// where the factor is 1 and weight_offset is ignored. The input norm is [tokens, hidden]; the per-head
// norms pass [tokens, heads, head_dim] and one [head_dim] weight shared by all heads.
// Throws Error(input) for a rank-0 input, a weight of the wrong length, or a negative or non-finite epsilon.
Tensor rmsnorm(const Tensor& input, std::span<const double> weight, double epsilon,
               double weight_offset = 0.0);

}  // namespace attnplan::reference
