// The per-tensor k_scale / v_scale of an fp8 KV cache, read from the checkpoint that calibrated them
// (specs/formats.md: stored k_q = fp8(k / k_scale), read k = k_q * k_scale).
//
// Quantizers store them as one scalar tensor per layer, under names that differ by tool. Under a layer
// prefix ("model.layers.7.") the names tried, for k (v likewise with v_scale, v_proj):
//   self_attn.k_scale                llm-compressor / compressed-tensors kv_cache_scheme, vLLM's fp8 examples
//   self_attn.attn.k_scale           vLLM's own module path (what vLLM remaps every other name to)
//   self_attn.k_proj.k_scale         NVIDIA ModelOpt (vLLM maybe_remap_kv_scale_name: "modelopt" names)
//   self_attn.k_proj.output_scale    older compressed-tensors and AMD Quark (vLLM get_cache_scale)
//   self_attn.kv_scale               legacy AutoFP8: one scale for both k and v (deprecated in vLLM)
// Each is F32, BF16 or F16 of shape [] or [1], finite and > 0. Where several are present they must agree.
//
// The query / probability scales the same tools write for fp8 attention (self_attn.q_scale,
// self_attn.attn.q_scale, self_attn.q_proj.output_scale, self_attn.prob_output_scale) are recognised and
// ignored: attnplan computes attention in bf16 / fp32 from the dequantized cache.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/attention_config.hpp"
#include "io/safetensors.hpp"

namespace attnplan::io {

// The scales an fp8 cache runs with, and where each came from: the checkpoint tensor's full name, or
// "/kv_cache/k_scale" (the config) when the checkpoint has none.
struct KvCacheScales {
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  std::string k_source;
  std::string v_source;
  friend bool operator==(const KvCacheScales&, const KvCacheScales&) = default;
};

// True for the names above (and the ignored q / prob scales), relative to the layer prefix: the layer loader
// accepts them beside the attention's weights whatever the cache dtype.
bool is_kv_scale_name(std::string_view relative);

// The scale tensor names tried for "k" or "v", in the order above (relative to the layer prefix).
std::vector<std::string> kv_scale_names(char which);

// The scales of an fp8_e4m3 cache (nullopt for a bf16 cache: a checkpoint's scales are then unused).
// Per scale: the checkpoint's value if it has one (it must equal a value the config gives, compared as
// f32), else the config's. Each problem is appended to `problems` as one line naming the tensor(s) or the
// config field and the rule: a wrong dtype or shape, a value not finite and > 0, two names that disagree,
// a checkpoint value that disagrees with the config's, or no scale at all (naming every tensor tried).
// With problems, the result is nullopt.
std::optional<KvCacheScales> read_kv_cache_scales(const SafetensorsFile& file,
                                                  const config::AttentionConfig& config,
                                                  const std::string& prefix,
                                                  std::vector<std::string>& problems);

// The same, throwing Error(input) with one details() line per problem.
std::optional<KvCacheScales> read_kv_cache_scales(const SafetensorsFile& file,
                                                  const config::AttentionConfig& config,
                                                  const std::string& prefix);

}  // namespace attnplan::io
