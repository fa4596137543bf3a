#include "config/hf_quantization.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <regex>
#include <string_view>

namespace attnplan::config::detail {
namespace {

constexpr std::string_view kQuantMethods = "fp8, awq, gptq, mxfp4, modelopt, compressed-tensors";

// Keys of the quantizers' configs that change nothing attnplan reads: calibration and kernel-selection
// settings of the tool that wrote the checkpoint.
constexpr std::array<std::string_view, 4> kAwqIrrelevant = {"backend", "do_fuse", "fuse_max_seq_len",
                                                            "modules_to_fuse"};
constexpr std::array<std::string_view, 23> kGptqIrrelevant = {"backend",
                                                              "batch_size",
                                                              "block_name_to_quantize",
                                                              "cache_block_outputs",
                                                              "damp_auto_increment",
                                                              "damp_percent",
                                                              "dataset",
                                                              "exllama_config",
                                                              "lm_head",
                                                              "max_input_length",
                                                              "meta",
                                                              "model_file_base_name",
                                                              "model_name_or_path",
                                                              "model_seqlen",
                                                              "module_name_preceding_first_block",
                                                              "pack_dtype",
                                                              "pad_token_id",
                                                              "static_groups",
                                                              "tokenizer",
                                                              "true_sequential",
                                                              "use_cuda_fp16",
                                                              "use_exllama",
                                                              "quant_method"};

// A list of module patterns (null reads as none).
std::vector<std::string> read_patterns(Fields& fields, std::string_view key) {
  const json* value = fields.get(key);
  std::vector<std::string> patterns;
  if (value == nullptr) return patterns;
  if (!value->is_array()) {
    fields.problem(key, fmt::format("expected a list of module names, got {}", describe(*value)));
    return patterns;
  }
  for (const json& item : *value) {
    if (item.is_string()) {
      patterns.push_back(item.get<std::string>());
    } else if (item.is_array()) {  // GPTQ modules_in_block_to_quantize: a list of lists
      for (const json& inner : item)
        if (inner.is_string()) patterns.push_back(inner.get<std::string>());
    } else {
      fields.problem(key, fmt::format("expected module names (strings), got {}", describe(item)));
    }
  }
  return patterns;
}

void set_patterns(Fields& fields, std::string_view key, HfQuantization& out, bool list_converted = false) {
  if (!fields.has(key)) {
    fields.get(key);  // null: marked known, no patterns
    return;
  }
  out.patterns = read_patterns(fields, key);
  out.patterns_path = fields.path(key);
  out.patterns_list_converted = list_converted;
}

// HF FineGrainedFP8Config (Qwen3-FP8, DeepSeek-V3) and AutoFP8's `fp8`.
void read_fp8(Fields& q, HfQuantization& out) {
  WeightEncoding& e = out.encoding;
  e.format = WeightFormat::fp8;
  if (const auto fmt_name = q.string("fmt"); fmt_name && *fmt_name != "e4m3") {
    q.problem("fmt", fmt::format("\"{}\" is not supported: fp8 weights are e4m3fn", *fmt_name));
  }
  // HF's default is dynamic: activations quantized per token at run time.
  const std::string scheme = q.string("activation_scheme").value_or("dynamic");
  if (scheme == "dynamic") {
    e.activation = ActivationType::fp8;
    out.notes.push_back(
        "quantization_config: fp8 with dynamic activations imports as projection.activation fp8 (activations "
        "quantized per token at run time; needs sm_89 or newer); set activation to bf16 to run the same "
        "weights weight-only on older GPUs");
  } else if (scheme == "static") {
    q.problem("activation_scheme",
              "static is not supported: static activation scales (a calibrated input_scale per projection) "
              "are not read; attnplan quantizes activations per token at run time (dynamic)");
  } else {
    q.problem("activation_scheme", fmt::format("\"{}\" is not one of dynamic, static", scheme));
  }
  if (const json* block = q.get("weight_block_size")) {
    if (*block == json::array({128, 128})) {
      e.scale_granularity = Fp8ScaleGranularity::block;
    } else {
      q.problem("weight_block_size", fmt::format("{} is not supported: fp8 block scales are [128, 128] "
                                                 "(weight_scale_inv per 128x128 block)",
                                                 block->dump()));
    }
  } else {
    e.scale_granularity = Fp8ScaleGranularity::tensor;  // AutoFP8: one weight_scale per tensor
  }
  set_patterns(q, "modules_to_not_convert", out);
  if (out.patterns.empty()) set_patterns(q, "ignored_layers", out);  // AutoFP8's spelling
  q.refuse_unknown_parameters("quant_method fp8");
}

// AutoAWQ's GEMM layout (qweight [K, N/8]).
void read_awq(Fields& q, HfQuantization& out) {
  WeightEncoding& e = out.encoding;
  e.format = WeightFormat::packed_integer;
  e.scheme = PackedIntegerScheme::awq;
  e.bits = q.positive("bits").value_or(4);
  if (e.bits != 4) q.problem("bits", fmt::format("{}: AWQ packs 4-bit values only", e.bits));
  if (const auto group = q.integer("group_size")) e.group_size = static_cast<int>(*group);
  if (const auto zero_point = q.boolean("zero_point"); zero_point && !*zero_point) {
    q.problem("zero_point", "false is not supported: attnplan's awq format reads qzeros");
  }
  if (const auto version = q.string("version"); version && *version != "gemm" && *version != "GEMM") {
    q.problem("version", fmt::format("\"{}\" is not supported: attnplan reads AWQ's GEMM layout (qweight [K, "
                                     "N/8], nibble order 0 2 4 6 1 3 5 7)",
                                     *version));
  }
  set_patterns(q, "modules_to_not_convert", out);
  q.irrelevant_all(kAwqIrrelevant);
  q.get("quant_method");
  q.refuse_unknown_parameters("quant_method awq");
}

// AutoGPTQ / GPTQModel through HF's GPTQConfig.
void read_gptq(Fields& q, HfQuantization& out) {
  WeightEncoding& e = out.encoding;
  e.format = WeightFormat::packed_integer;
  e.bits = q.positive("bits").value_or(4);
  if (e.bits != 4 && e.bits != 8)
    q.problem("bits", fmt::format("{}: attnplan reads 4- or 8-bit GPTQ", e.bits));
  if (const auto group = q.integer("group_size")) e.group_size = static_cast<int>(*group);
  e.act_order = q.boolean("desc_act").value_or(false);
  q.boolean("sym");  // symmetric or not, the zero points are stored in qzeros and read from there
  const std::string format = q.string("checkpoint_format").value_or("gptq");
  if (format == "gptq") {
    e.scheme = PackedIntegerScheme::gptq;
  } else if (format == "gptq_v2") {
    e.scheme = PackedIntegerScheme::gptq_v2;
  } else {
    q.problem("checkpoint_format",
              fmt::format("\"{}\" is not supported (supported: gptq, gptq_v2): another packing", format));
  }
  set_patterns(q, "modules_in_block_to_quantize", out, /*list_converted=*/true);
  q.irrelevant_all(kGptqIrrelevant);
  q.refuse_unknown_parameters("quant_method gptq");
}

// gpt-oss: MXFP4 experts; its modules_to_not_convert keeps attention in bf16.
void read_mxfp4(Fields& q, HfQuantization& out) {
  out.encoding.format = WeightFormat::mxfp4;
  set_patterns(q, "modules_to_not_convert", out);
  q.get("quant_method");
  q.refuse_unknown_parameters("quant_method mxfp4");
}

// NVIDIA ModelOpt: flat in config.json, or under `quantization` as in hf_quant_config.json.
void read_modelopt(Fields& outer, HfQuantization& out) {
  outer.get("quant_method");
  outer.get("producer");  // the tool's name and version
  std::optional<Fields> nested;
  Fields* fields = &outer;
  if (const json* inner = outer.get("quantization"); inner != nullptr && inner->is_object()) {
    nested.emplace(*inner, outer.path("quantization"), outer.problems());
    fields = &*nested;
  }
  Fields& q = *fields;
  const std::optional<std::string> algo = q.string("quant_algo");
  WeightEncoding& e = out.encoding;
  if (!algo) {
    // KV cache only: the weights stay as they are (bf16).
  } else if (*algo == "FP8") {
    out.weights_quantized = true;
    e.format = WeightFormat::fp8;
    e.scale_granularity = Fp8ScaleGranularity::tensor;
    e.activation = ActivationType::bf16;
    out.notes.push_back(
        "quantization_config: ModelOpt FP8 calibrates static activation scales (input_scale); attnplan runs "
        "these fp8 weights with bf16 activations (weight-only)");
  } else if (*algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    out.weights_quantized = true;
    e.format = WeightFormat::fp8;
    e.scale_granularity = Fp8ScaleGranularity::channel;
    e.activation = ActivationType::fp8;
  } else if (*algo == "NVFP4") {
    out.weights_quantized = true;
    e.format = WeightFormat::nvfp4;
    if (const auto group = q.integer("group_size"); group && *group != 16) {
      q.problem("group_size", fmt::format("{}: NVFP4 scales blocks of 16", *group));
    }
  } else if (*algo == "MXFP8") {
    out.weights_quantized = true;
    e.format = WeightFormat::mxfp8;
  } else {
    q.problem("quant_algo",
              fmt::format("\"{}\" is not supported (supported: FP8, FP8_PER_CHANNEL_PER_TOKEN, NVFP4, MXFP8)",
                          *algo));
  }
  q.get("group_size");
  if (const auto kv = q.string("kv_cache_quant_algo")) {
    if (*kv == "FP8") {
      out.kv_cache = KvCacheDtype::fp8_e4m3;
    } else {
      q.problem("kv_cache_quant_algo", fmt::format("\"{}\" is not supported (supported: FP8)", *kv));
    }
  }
  set_patterns(q, "exclude_modules", out);
  if (nested) nested->refuse_unknown_parameters("ModelOpt quantization");
  outer.refuse_unknown_parameters("quant_method modelopt");
}

// One compressed-tensors quantization args object (weights, input_activations, kv_cache_scheme): fp8 e4m3
// is {num_bits 8, type float}.
bool is_fp8_args(Fields& args) {
  const auto bits = args.integer("num_bits");
  const auto type = args.string("type");
  return bits && *bits == 8 && type && *type == "float";
}

// llm-compressor's compressed-tensors: the fp8 "float-quantized" checkpoints map cleanly (weight +
// weight_scale per tensor or channel); the packed formats name their tensors differently.
void read_compressed_tensors(Fields& q, HfQuantization& out) {
  q.get("quant_method");
  q.irrelevant_all(std::array<std::string_view, 6>{"global_compression_ratio", "quantization_status",
                                                   "sparsity_config", "version", "transform_config",
                                                   "provider"});
  const std::optional<std::string> format = q.string("format");
  const json* groups = q.get("config_groups");
  if (groups != nullptr && !groups->empty()) {
    if (!groups->is_object() || groups->size() != 1) {
      q.problem("config_groups", "one group is supported (one scheme for every Linear)");
    } else {
      const auto first = groups->begin();
      Fields g(first.value(), q.path("config_groups") + "/" + pointer_token(first.key()), q.problems());
      const std::vector<std::string> targets = read_patterns(g, "targets");
      if (std::find(targets.begin(), targets.end(), "Linear") == targets.end()) out.targets = targets;
      g.get("output_activations");
      g.get("format");
      out.weights_quantized = true;
      WeightEncoding& e = out.encoding;
      e.format = WeightFormat::fp8;
      if (format && *format != "float-quantized") {
        q.problem("format",
                  fmt::format("\"{}\" does not map to an attnplan format: only float-quantized (fp8 "
                              "weight + weight_scale) does",
                              *format));
      }
      if (const json* weights = g.get("weights"); weights != nullptr && weights->is_object()) {
        Fields w(*weights, g.path("weights"), q.problems());
        if (!is_fp8_args(w)) {
          w.problem("num_bits", "only fp8 weights (num_bits 8, type float) map to an attnplan format");
        }
        const std::string strategy = w.string("strategy").value_or("tensor");
        if (strategy == "tensor") {
          e.scale_granularity = Fp8ScaleGranularity::tensor;
        } else if (strategy == "channel") {
          e.scale_granularity = Fp8ScaleGranularity::channel;
        } else {
          w.problem("strategy",
                    fmt::format("\"{}\" does not map: fp8 weights with tensor or channel scales do "
                                "(block scales are stored as weight_scale, attnplan reads "
                                "weight_scale_inv)",
                                strategy));
        }
        if (const auto dynamic = w.boolean("dynamic"); dynamic && *dynamic) {
          w.problem("dynamic", "true does not map: weight scales are stored in the checkpoint");
        }
        w.irrelevant({"symmetric", "group_size", "block_structure", "observer", "observer_kwargs", "actorder",
                      "zp_dtype", "scale_dtype"});
        w.refuse_unknown_parameters("compressed-tensors weights");
      } else {
        g.problem("weights", "required: an object");
      }
      if (const json* inputs = g.get("input_activations"); inputs != nullptr && inputs->is_object()) {
        Fields a(*inputs, g.path("input_activations"), q.problems());
        if (!is_fp8_args(a)) a.problem("num_bits", "only fp8 activations (num_bits 8, type float) map");
        if (!a.boolean("dynamic").value_or(false)) {
          a.problem("dynamic",
                    "false (static activation scales) is not supported: attnplan quantizes "
                    "activations per token at run time");
        }
        a.irrelevant({"strategy", "symmetric", "group_size", "block_structure", "observer", "observer_kwargs",
                      "actorder", "zp_dtype", "scale_dtype"});
        a.refuse_unknown_parameters("compressed-tensors input_activations");
        e.activation = ActivationType::fp8;
      }
      g.refuse_unknown_parameters("a compressed-tensors config group");
    }
  }
  if (const json* kv = q.get("kv_cache_scheme"); kv != nullptr && kv->is_object()) {
    Fields k(*kv, q.path("kv_cache_scheme"), q.problems());
    if (!is_fp8_args(k)) k.problem("num_bits", "only an fp8 cache (num_bits 8, type float) maps: fp8_e4m3");
    if (const auto strategy = k.string("strategy"); strategy && *strategy != "tensor") {
      k.problem("strategy", fmt::format("\"{}\": attnplan's fp8 cache has one k_scale and one v_scale per "
                                        "layer (strategy tensor)",
                                        *strategy));
    }
    k.irrelevant({"dynamic", "symmetric", "group_size", "block_structure", "observer", "observer_kwargs",
                  "actorder", "zp_dtype", "scale_dtype"});
    k.refuse_unknown_parameters("compressed-tensors kv_cache_scheme");
    out.kv_cache = KvCacheDtype::fp8_e4m3;
  }
  set_patterns(q, "ignore", out);
  q.refuse_unknown_parameters("quant_method compressed-tensors");
}

// MLX (mlx-lm): {group_size, bits}, affine with scales and biases; per-module overrides are module paths.
void read_mlx(Fields& q, HfQuantization& out) {
  WeightEncoding& e = out.encoding;
  e.format = WeightFormat::affine;
  e.bits = q.positive("bits").value_or(4);
  e.group_size = q.positive("group_size").value_or(64);
  if (const auto mode = q.string("mode"); mode && *mode != "affine") {
    q.problem("mode", fmt::format("\"{}\" is not supported (supported: affine)", *mode));
  }
  // mlx-lm's mixed quantization: "model.layers.0.self_attn.q_proj": false keeps a module unquantized.
  for (const auto& [key, value] : q.object().items()) {
    if (key.find('.') == std::string::npos) continue;
    q.get(key);
    if (value.is_boolean() && !value.get<bool>()) {
      out.patterns.push_back(key);
      out.patterns_path = q.prefix();
    } else if (value.is_object()) {
      // Recorded as a pattern with its own parameters: apply_hf_quantization refuses it for attention.
      out.patterns.push_back("override:" + key);
      out.patterns_path = q.prefix();
    }
  }
  q.refuse_unknown_parameters("MLX quantization");
}

// '*' matches any characters (none included) within one dotted component.
bool glob_component(std::string_view pattern, std::string_view text) {
  if (pattern.empty()) return text.empty();
  if (pattern.front() == '*') {
    for (std::size_t skip = 0; skip <= text.size(); ++skip)
      if (glob_component(pattern.substr(1), text.substr(skip))) return true;
    return false;
  }
  return !text.empty() && pattern.front() == text.front() &&
         glob_component(pattern.substr(1), text.substr(1));
}

std::vector<std::string_view> components(std::string_view name) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

}  // namespace

bool names_module(const std::string& pattern, const std::string& module) {
  if (pattern.starts_with("re:")) {
    try {
      return std::regex_search(module, std::regex(pattern.substr(3)), std::regex_constants::match_continuous);
    } catch (const std::regex_error&) {
      return false;  // reported by apply_hf_quantization
    }
  }
  const auto wanted = components(pattern), parts = components(module);
  for (std::size_t first = 0; first + wanted.size() <= parts.size(); ++first) {
    bool all = true;
    for (std::size_t i = 0; i < wanted.size() && all; ++i) all = glob_component(wanted[i], parts[first + i]);
    if (all) return true;
  }
  return false;
}

HfQuantization read_hf_quantization(Fields& top) {
  HfQuantization out;
  const json* mlx = top.get("quantization");
  const json* hf = top.get("quantization_config");
  // mlx-lm writes its `quantization` again as `quantization_config` (no quant_method) for HF tools.
  const bool hf_is_mlx_copy = hf != nullptr && mlx != nullptr && *hf == *mlx;
  if (hf != nullptr && !hf_is_mlx_copy) {
    if (!hf->is_object()) {
      top.problem("quantization_config", fmt::format("expected an object, got {}", describe(*hf)));
      return out;
    }
    Fields q(*hf, top.path("quantization_config"), top.problems());
    const std::optional<std::string> method = q.string("quant_method");
    out.weights_quantized = true;
    if (!method) {
      if (!q.has("quant_method"))
        q.problem("quant_method", fmt::format("required (one of {})", kQuantMethods));
      return out;
    }
    if (*method == "fp8") {
      read_fp8(q, out);
    } else if (*method == "awq") {
      read_awq(q, out);
    } else if (*method == "gptq") {
      read_gptq(q, out);
    } else if (*method == "mxfp4") {
      read_mxfp4(q, out);
    } else if (*method == "modelopt") {
      out.weights_quantized = false;  // by quant_algo
      read_modelopt(q, out);
    } else if (*method == "compressed-tensors") {
      out.weights_quantized = false;  // by config_groups
      read_compressed_tensors(q, out);
    } else {
      q.problem("quant_method",
                fmt::format("\"{}\" is not supported by import-hf (supported: {})", *method, kQuantMethods));
    }
    if (mlx != nullptr)
      top.problem("quantization", "given beside a quantization_config that differs from it");
    return out;
  }
  if (mlx != nullptr) {
    if (!mlx->is_object()) {
      top.problem("quantization", fmt::format("expected an object, got {}", describe(*mlx)));
      return out;
    }
    Fields q(*mlx, top.path("quantization"), top.problems());
    out.weights_quantized = true;
    read_mlx(q, out);
  }
  return out;
}

void apply_hf_quantization(const HfQuantization& quantization, int layer, AttentionConfig& config,
                           std::vector<std::string>& problems) {
  if (quantization.kv_cache) config.kv_cache.dtype = *quantization.kv_cache;
  if (!quantization.weights_quantized) return;
  for (const auto& pattern : quantization.patterns) {
    if (!pattern.starts_with("re:")) continue;
    try {
      std::regex check(pattern.substr(3));
    } catch (const std::regex_error&) {
      problems.push_back(
          fmt::format("{}: \"{}\" is not a valid regular expression", quantization.patterns_path, pattern));
    }
  }
  const std::string attention = fmt::format("model.layers.{}.self_attn.", layer);
  // Whether the quantization converts module `projection` of this layer.
  const auto converted = [&](std::string_view projection) {
    const std::string module = attention + std::string(projection);
    bool named = false;
    for (const auto& pattern : quantization.patterns) {
      if (pattern.starts_with("override:")) {
        if (names_module(pattern.substr(9), module)) {
          problems.push_back(
              fmt::format("{}/{}: per-module bits or group_size for an attention projection are "
                          "not supported (false, to keep it unquantized, is)",
                          quantization.patterns_path, pointer_token(pattern.substr(9))));
        }
        continue;
      }
      named = named || names_module(pattern, module);
    }
    const bool targeted =
        quantization.targets.empty() ||
        std::any_of(quantization.targets.begin(), quantization.targets.end(),
                    [&](const std::string& target) { return names_module(target, module); });
    return targeted && (quantization.patterns_list_converted ? named : !named);
  };
  const WeightEncoding bf16{};
  config.projection.output = converted("o_proj") ? quantization.encoding : bf16;
  if (config.projection.fused_qkv) {
    config.projection.qkv = converted("qkv_proj") ? quantization.encoding : bf16;
    return;
  }
  const std::array<std::string_view, 3> names = {"q_proj", "k_proj", "v_proj"};
  std::vector<std::string_view> kept, quantized;
  for (const auto name : names) (converted(name) ? quantized : kept).push_back(name);
  if (!kept.empty() && !quantized.empty()) {
    problems.push_back(
        fmt::format("{}: keeps {} unquantized but converts {} (layer {}): q, k and v share one "
                    "format in attnplan/v1",
                    quantization.patterns_path, fmt::join(kept, ", "), fmt::join(quantized, ", "), layer));
  }
  config.projection.qkv = quantized.empty() ? bf16 : quantization.encoding;
}

}  // namespace attnplan::config::detail
