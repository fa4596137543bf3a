// AttentionConfig: the typed form of a config.json (schema "attnplan/v1"). Every field and its
// default is documented in docs/config.md; the semantics are those of the attention spec
// (input norm, QKV projection, per-head norms, RoPE, paged KV cache, attention, output projection).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "config/target.hpp"

namespace attnplan::config {

inline constexpr std::string_view kSchema = "attnplan/v1";

struct InputNorm {
  double epsilon = 1e-5;
  // 0: y = x_hat * w (Llama, Qwen); 1: y = x_hat * (1 + w) (Gemma stores w around zero).
  double weight_offset = 0.0;
  friend bool operator==(const InputNorm&, const InputNorm&) = default;
};

// Per-head RMSNorm applied before RoPE. q and k use a [head_dim] weight shared by all heads;
// v (Gemma 3n) is normalized without a weight.
struct QkvNorm {
  bool query = false;
  bool key = false;
  bool value = false;
  double weight_offset = 0.0;
  std::optional<double> epsilon;  // unset: input_norm.epsilon
  friend bool operator==(const QkvNorm&, const QkvNorm&) = default;
};

enum class RopeScalingType { none, linear, llama3, yarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;                     // linear, llama3, yarn
  double low_freq_factor = 1.0;            // llama3
  double high_freq_factor = 4.0;           // llama3
  std::int64_t original_max_position = 0;  // llama3, yarn (required for both)
  double beta_fast = 32.0;                 // yarn
  double beta_slow = 1.0;                  // yarn
  bool truncate = true;                    // yarn
  std::optional<double> attention_factor;  // yarn; unset: 0.1 ln(factor) + 1 (1 if factor <= 1)
  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct Rotary {
  int offset = 0;                  // first rotated dimension (DeepSeek MLA-style rope at the end: 128)
  std::optional<int> dim;          // rotary dim R; unset: head_dim - offset. 0 disables RoPE.
  std::optional<int> pairing_dim;  // P2; unset: R (rotate_half). 2 = interleaved (GPT-J).
  double theta = 10000.0;
  RopeScaling scaling;
  friend bool operator==(const Rotary&, const Rotary&) = default;
};

enum class WeightFormat { bf16, fp8, mxfp8, mxfp4, nvfp4, packed_integer, affine };
enum class Fp8ScaleGranularity { tensor, channel, block };
enum class ActivationType { bf16, fp8 };
enum class PackedIntegerScheme { gptq, gptq_v2, awq };

// How a projection with fp8 activations scales them (specs/formats.md; the rounding rule is in
// templates/attnplan/gemm_sm90_fp8_params.h): one scale per token under tensor and channel weight scales,
// one per token and 128 channels under 128x128 block weight scales (which the GEMM applies per 128-wide K
// block, so the activation scales come along at no cost there).
enum class Fp8ActivationScales { token, token_group };
constexpr Fp8ActivationScales fp8_activation_scales(Fp8ScaleGranularity weights) {
  return weights == Fp8ScaleGranularity::block ? Fp8ActivationScales::token_group
                                               : Fp8ActivationScales::token;
}

// The format of one projection's weights (specs/formats.md). Only the fields of `format` are
// meaningful; the parser rejects fields that belong to another format.
struct WeightEncoding {
  WeightFormat format = WeightFormat::bf16;
  // fp8
  Fp8ScaleGranularity scale_granularity = Fp8ScaleGranularity::tensor;
  ActivationType activation = ActivationType::bf16;
  // packed_integer
  PackedIntegerScheme scheme = PackedIntegerScheme::gptq;
  int bits = 4;            // packed_integer: 4 | 8; affine: 2 | 3 | 4 | 5 | 6 | 8
  int group_size = 128;    // packed_integer: -1 = per channel; affine: 32 | 64 | 128
  bool act_order = false;  // packed_integer (GPTQ g_idx)
  friend bool operator==(const WeightEncoding&, const WeightEncoding&) = default;
};

struct Projection {
  WeightEncoding qkv;      // q_proj, k_proj, v_proj (or the fused qkv_proj)
  WeightEncoding output;   // o_proj; defaults to the qkv encoding
  bool fused_qkv = false;  // one [q; k; v] tensor (Phi-3 `qkv_proj`)
  friend bool operator==(const Projection&, const Projection&) = default;
};

enum class KvCacheDtype { bf16, fp8_e4m3 };

struct KvCache {
  int block_size = 16;  // tokens per page
  KvCacheDtype dtype = KvCacheDtype::bf16;
  // fp8_e4m3 only: per-tensor scales, stored k_q = fp8(k / k_scale), read k = k_q * k_scale (formats.md).
  // Unset means "not given": where a checkpoint is read (io::load_layer_weights) its own scale tensors are
  // used and a given value must agree with them; without a checkpoint (random weights) an unset scale is 1.
  // The plan takes the scales at run time (plan::KvCacheView), so they never change a kernel.
  std::optional<double> k_scale;
  std::optional<double> v_scale;
  friend bool operator==(const KvCache&, const KvCache&) = default;
};

struct AttentionConfig {
  std::string name;        // free text, e.g. "Llama-3.1-8B"
  int hidden_size = 0;     // required
  int query_heads = 0;     // required
  int kv_heads = 0;        // unset in JSON: query_heads (MHA)
  int head_dim = 0;        // unset in JSON: hidden_size / query_heads
  int value_head_dim = 0;  // unset in JSON: head_dim
  InputNorm input_norm;
  bool qkv_bias = false;
  bool output_bias = false;
  QkvNorm qkv_norm;
  Rotary rotary;
  std::optional<double> attention_scale;  // unset: 1 / sqrt(head_dim)
  std::optional<double> softcap;          // unset: no logit soft-capping
  std::optional<int> sliding_window;      // W keys including the query's own; unset: full causal
  bool bidirectional_spans = false;       // accept per-sequence bidirectional spans (Gemma 3 images)
  bool sinks = false;                     // one learned sink logit per query head (gpt-oss)
  Projection projection;
  KvCache kv_cache;
  int max_tokens = 8192;  // most tokens one execute() may carry
  Target target;

  // Resolved values, valid after parse (which fills every unset optional it can).
  int rotary_dim() const { return rotary.dim.value_or(head_dim - rotary.offset); }
  int pairing_dim() const { return rotary.pairing_dim.value_or(rotary_dim()); }
  double qkv_norm_epsilon() const { return qkv_norm.epsilon.value_or(input_norm.epsilon); }
  int group_size() const { return query_heads / kv_heads; }  // query heads per kv head

  friend bool operator==(const AttentionConfig&, const AttentionConfig&) = default;
};

std::string_view to_string(RopeScalingType);
std::string_view to_string(WeightFormat);
std::string_view to_string(Fp8ScaleGranularity);
std::string_view to_string(ActivationType);
std::string_view to_string(PackedIntegerScheme);
std::string_view to_string(Fp8ActivationScales);  // "token", "token_group"
std::string_view to_string(KvCacheDtype);

}  // namespace attnplan::config
