// A Hugging Face config.json's quantization description -> the projection formats and KV cache dtype of
// attnplan/v1 (docs/config.md, "Quantized checkpoints"). Internal to the config module: hf_import.cpp reads
// it from the top-level object before the family's fields and applies it once the family is known.
//
// Read: `quantization_config` by `quant_method` (fp8, awq, gptq, mxfp4, modelopt, compressed-tensors) and
// MLX's `quantization` ({group_size, bits}). Every value attnplan cannot run exactly is a problem naming its
// HF path and value; so is an unknown quant_method or parameter.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/attention_config.hpp"
#include "config/hf_fields.hpp"

namespace attnplan::config::detail {

struct HfQuantization {
  bool weights_quantized = false;  // a weight quantization was described
  WeightEncoding encoding;         // of the projections it converts
  // Module patterns (HF `modules_to_not_convert` / `ignore` / `exclude_modules` spellings, module paths
  // with '*' or compressed-tensors "re:" regexes) and where they were read, for messages.
  std::vector<std::string> patterns;
  std::string patterns_path;
  // false: the patterns name modules kept unconverted; true: they name the only modules converted
  // (GPTQ `modules_in_block_to_quantize`).
  bool patterns_list_converted = false;
  // compressed-tensors group `targets` other than "Linear": only the modules they name are converted.
  std::vector<std::string> targets;
  std::optional<KvCacheDtype> kv_cache;  // a KV cache quantization was described
  std::vector<std::string> notes;        // caveats for the user
};

// Reads `quantization_config` / `quantization` from `top` (marking them known); problems go to top's list.
HfQuantization read_hf_quantization(Fields& top);

// Whether a module pattern names `module` ("model.layers.3.self_attn.q_proj"): "re:<regex>" matching from
// the start of the name (compressed-tensors), else a run of the name's dotted components equal to the
// pattern's components, where '*' matches any characters within one component ("model.layers.*.self_attn"
// names every layer's attention; "self_attn" and "q_proj" name modules anywhere).
bool names_module(const std::string& pattern, const std::string& module);

// Sets config.projection.qkv / .output and config.kv_cache.dtype from `quantization` for layer `layer`:
// a projection a pattern leaves unconverted stays bf16. q, k and v share one format in attnplan/v1, so a
// pattern that keeps some of them but not all is a problem (naming patterns_path).
void apply_hf_quantization(const HfQuantization& quantization, int layer, AttentionConfig& config,
                           std::vector<std::string>& problems);

}  // namespace attnplan::config::detail
