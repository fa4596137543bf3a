// The checkpoint tensors of one projection in each weight format (specs/formats.md), by role: what the
// loader reads and checks, what the saver writes, what the reference and the kernels dequantize.
//
// Weight W is logically [N = out_features, K = in_features]. A projection `base` ("self_attn.q_proj")
// reads, per format (G = group size, G = -1 per channel means one group of K; P = 32 / bits values per
// 32-bit word):
//   bf16            base.weight BF16 [N, K]
//   fp8 tensor      base.weight F8_E4M3 [N, K], base.weight_scale F32 [] or [1]
//   fp8 channel     base.weight F8_E4M3 [N, K], base.weight_scale F32 [N] or [N, 1]
//   fp8 block       base.weight F8_E4M3 [N, K], base.weight_scale_inv F32|BF16 [ceil(N/128), ceil(K/128)]
//   mxfp8           base.weight F8_E4M3 [N, K], base.weight_scale U8 (E8M0) [N, K/32]
//   mxfp4           base.weight U8 [N, K/2], base.weight_scale U8 (E8M0) [N, K/32]; or, as gpt-oss names
//                   them, base_blocks U8 [N, K/32, 16] and base_scales U8 [N, K/32] (same bytes)
//   nvfp4           base.weight U8 [N, K/2], base.weight_scale F8_E4M3 [N, K/16], base.weight_scale_2 F32
//   []|[1] packed_integer  gptq/gptq_v2: base.qweight I32 [K/P, N], base.qzeros I32 [K/G, N/P],
//                   base.scales F16|BF16|F32 [K/G, N], base.g_idx I32 [K] (required with act_order,
//                   read when present otherwise); awq: base.qweight I32 [K, N/8], base.qzeros I32 [K/G, N/8],
//                   base.scales F16|BF16|F32 [K/G, N]
//   affine (MLX)    base.weight U32 [N, K*bits/32], base.scales and base.biases F16|BF16|F32 [N, K/G]
// The weight role keeps the stored bytes and layout (GPTQ/AWQ stay [K, N]-major); only gpt-oss `_blocks`
// is reshaped to [N, K/2], the layout of the same bytes under the standard name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/attention_config.hpp"
#include "io/dtype.hpp"

namespace attnplan::io {

enum class TensorRole { weight, scales, scale_2, zeros, g_idx };

// One tensor a projection's format asks for.
struct ProjectionTensorRule {
  TensorRole role = TensorRole::weight;
  std::string relative;                           // name under the layer prefix: "self_attn.q_proj.qweight"
  std::vector<Dtype> dtypes;                      // accepted
  std::vector<std::vector<std::int64_t>> shapes;  // accepted; the first is the one messages and savers use
  std::string formula;                            // the first shape in config terms: "[N, K / 32]"
  bool optional = false;                          // read when present (GPTQ g_idx without act_order)
};

// Values packed in one 32-bit word of a GPTQ/AWQ tensor: 8 for 4-bit, 4 for 8-bit.
int values_per_word(const config::WeightEncoding& encoding);
// Groups along K: K / group_size, or 1 for per-channel (-1).
std::int64_t group_count(const config::WeightEncoding& encoding, std::int64_t k);
// The K extent one scale covers along K (fp8 block 128, MX 32, nvfp4 16, integer/affine groups).
std::int64_t scale_group_k(const config::WeightEncoding& encoding, std::int64_t k);

// The tensors of projection `base` ("self_attn.q_proj") in `encoding`, for W [n, k]. `gpt_oss_names`
// (mxfp4 only) asks for base_blocks / base_scales instead of base.weight / base.weight_scale.
// Error(input) when n or k cannot hold the format's packing (n % P for GPTQ/AWQ zeros, k % 2 for fp4),
// naming the projection and the rule.
std::vector<ProjectionTensorRule> projection_tensor_rules(const config::WeightEncoding& encoding,
                                                          const std::string& base, std::int64_t n,
                                                          std::int64_t k, bool gpt_oss_names = false);

}  // namespace attnplan::io
