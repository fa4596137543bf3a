// HF config.json -> AttentionConfig. One function per model family reads the fields that matter to
// attention and lists the ones that do not; any key in neither is refused, so a new HF option that
// changes attention (a new mask kind, a new rope type) fails loudly instead of importing wrong.
// Defaults for absent fields are those of the family's HF config class (docs/config.md).
#include "config/hf_import.hpp"

#include <fmt/format.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/hf_fields.hpp"
#include "config/hf_quantization.hpp"
#include "config/parse.hpp"
#include "config/problems.hpp"
#include "core/error.hpp"

namespace attnplan::config {
namespace {

using detail::describe;
using detail::Fields;
using detail::pointer_token;

using nlohmann::json;

// PretrainedConfig's generic keys (generation, labels, bookkeeping): a config saved with
// `to_dict()` may carry any of them, and none changes a layer's attention.
constexpr std::string_view kGenericIrrelevant[] = {"_name_or_path",
                                                   "_attn_implementation",
                                                   "_attn_implementation_autoset",
                                                   "add_cross_attention",
                                                   "architectures",
                                                   "auto_map",
                                                   "bad_words_ids",
                                                   "begin_suppress_tokens",
                                                   "bos_token_id",
                                                   "chunk_size_feed_forward",
                                                   "cross_attention_hidden_size",
                                                   "decoder_start_token_id",
                                                   "diversity_penalty",
                                                   "do_sample",
                                                   "dtype",
                                                   "early_stopping",
                                                   "encoder_no_repeat_ngram_size",
                                                   "eos_token_id",
                                                   "exponential_decay_length_penalty",
                                                   "finetuning_task",
                                                   "forced_bos_token_id",
                                                   "forced_eos_token_id",
                                                   "id2label",
                                                   "initializer_range",
                                                   "is_decoder",
                                                   "is_encoder_decoder",
                                                   "label2id",
                                                   "length_penalty",
                                                   "max_length",
                                                   "max_position_embeddings",
                                                   "min_length",
                                                   "model_type",
                                                   "no_repeat_ngram_size",
                                                   "num_beam_groups",
                                                   "num_beams",
                                                   "num_hidden_layers",
                                                   "num_return_sequences",
                                                   "output_attentions",
                                                   "output_hidden_states",
                                                   "output_scores",
                                                   "pad_token_id",
                                                   "prefix",
                                                   "problem_type",
                                                   "pruned_heads",
                                                   "remove_invalid_values",
                                                   "repetition_penalty",
                                                   "return_dict",
                                                   "return_dict_in_generate",
                                                   "sep_token_id",
                                                   "suppress_tokens",
                                                   "task_specific_params",
                                                   "temperature",
                                                   "tf_legacy_loss",
                                                   "tie_encoder_decoder",
                                                   "tie_word_embeddings",
                                                   "tokenizer_class",
                                                   "top_k",
                                                   "top_p",
                                                   "torch_dtype",
                                                   "torchscript",
                                                   "transformers_version",
                                                   "typical_p",
                                                   "use_bfloat16",
                                                   "use_cache",
                                                   "vocab_size"};

// HF `rope_scaling` (`rope_type`, or the older `type`) -> rotary.scaling. Only the types attnplan/v1
// computes exactly are accepted; every parameter must belong to the chosen type.
RopeScaling read_rope_scaling(Fields& parent) {
  RopeScaling scaling;
  const json* value = parent.get("rope_scaling");
  if (value == nullptr) return scaling;
  if (!value->is_object()) {
    parent.problem("rope_scaling", fmt::format("expected an object or null, got {}", describe(*value)));
    return scaling;
  }
  Fields fields(*value, parent.path("rope_scaling"), parent.problems());
  const std::optional<std::string> rope_type = fields.string("rope_type");
  const std::optional<std::string> legacy_type = fields.string("type");
  const std::string_view type_key = rope_type ? "rope_type" : "type";
  const std::string type = rope_type ? *rope_type : legacy_type.value_or("");
  if (rope_type && legacy_type && *rope_type != *legacy_type) {
    fields.problem("type", fmt::format("\"{}\" contradicts rope_type \"{}\"", *legacy_type, *rope_type));
  }
  if (type.empty()) {
    if (!fields.has("rope_type") && !fields.has("type")) fields.problem("rope_type", "required");
    return scaling;
  }
  const auto required_number = [&](std::string_view key) {
    const bool present = fields.has(key);
    const std::optional<double> number = fields.number(key);
    if (!present) fields.problem(key, fmt::format("required for rope type {}", type));
    return number.value_or(1.0);
  };
  // HF reads a missing original_max_position_embeddings as the model's max_position_embeddings.
  const auto original_max_position = [&]() -> std::int64_t {
    if (fields.has("original_max_position_embeddings")) {
      return fields.positive("original_max_position_embeddings").value_or(1);
    }
    fields.get("original_max_position_embeddings");
    if (const json* fallback = parent.get_unmarked("max_position_embeddings");
        fallback != nullptr && fallback->is_number_integer() && fallback->get<std::int64_t>() > 0) {
      return fallback->get<std::int64_t>();
    }
    fields.problem(
        "original_max_position_embeddings",
        fmt::format("required for rope type {} (no max_position_embeddings to fall back on)", type));
    return 1;
  };

  if (type == "default") {
    // Plain RoPE, written out explicitly.
  } else if (type == "linear") {
    scaling.type = RopeScalingType::linear;
    scaling.factor = required_number("factor");
  } else if (type == "llama3") {
    scaling.type = RopeScalingType::llama3;
    scaling.factor = required_number("factor");
    scaling.low_freq_factor = fields.number("low_freq_factor").value_or(scaling.low_freq_factor);
    scaling.high_freq_factor = fields.number("high_freq_factor").value_or(scaling.high_freq_factor);
    scaling.original_max_position = original_max_position();
  } else if (type == "yarn") {
    scaling.type = RopeScalingType::yarn;
    scaling.factor = required_number("factor");
    scaling.original_max_position = original_max_position();
    scaling.beta_fast = fields.number("beta_fast").value_or(scaling.beta_fast);
    scaling.beta_slow = fields.number("beta_slow").value_or(scaling.beta_slow);
    scaling.truncate = fields.boolean("truncate").value_or(scaling.truncate);
    scaling.attention_factor = fields.number("attention_factor");
    // DeepSeek's yarn variant derives attention_factor from these; attnplan/v1 has no such rule.
    for (std::string_view key : {"mscale", "mscale_all_dim"}) {
      if (fields.has(key))
        fields.problem(key, "DeepSeek-style yarn mscale is not expressible in attnplan/v1");
      fields.get(key);
    }
  } else {
    fields.problem(type_key, fmt::format("{} is not expressible in attnplan/v1 (supported: default, linear, "
                                         "llama3, yarn)",
                                         type));
    return RopeScaling{};  // its parameters belong to a type already refused: no second complaint
  }
  fields.refuse_unknown_parameters(fmt::format("rope type {}", type));
  return scaling;
}

// Which layers use a sliding window. HF's `layer_types` wins when present; otherwise the family's
// own rule (`default_sliding`) picks, as the HF config class would fill layer_types in.
bool sliding_layer(Fields& fields, int layer, const std::function<bool(int)>& default_sliding) {
  const json* types = fields.get("layer_types");
  if (types == nullptr) return default_sliding(layer);
  if (!types->is_array()) {
    fields.problem("layer_types", fmt::format("expected an array, got {}", describe(*types)));
    return false;
  }
  if (static_cast<std::size_t>(layer) >= types->size()) {
    fields.problem("layer_types",
                   fmt::format("has {} entries; layer {} is out of range", types->size(), layer));
    return false;
  }
  const json& type = (*types)[static_cast<std::size_t>(layer)];
  if (type == "sliding_attention") return true;
  if (type == "full_attention") return false;
  fields.problems().push_back(
      fmt::format("{}/{}: {} is not expressible in attnplan/v1 (known: sliding_attention, full_attention)",
                  fields.path("layer_types"), layer, describe(type)));
  return false;
}

void check_layer_range(Fields& fields, std::string_view key, int layer) {
  if (const std::optional<int> layers = fields.positive(key); layers && layer >= *layers) {
    fields.problem(key, fmt::format("layer {} is out of range: the model has {} layers", layer, *layers));
  }
}

// The shapes every family shares. `kv_default_mha`: the HF class reads a missing
// num_key_value_heads as num_attention_heads; elsewhere its default is a fixed number that differs
// between classes, so the field is required instead of guessed.
void read_heads(Fields& fields, AttentionConfig& config, bool kv_default_mha) {
  config.hidden_size = fields.required_positive("hidden_size");
  config.query_heads = fields.required_positive("num_attention_heads");
  if (fields.has("num_key_value_heads") || !kv_default_mha) {
    config.kv_heads = fields.required_positive("num_key_value_heads");
  } else {
    fields.get("num_key_value_heads");
    config.kv_heads = config.query_heads;
  }
  if (const std::optional<int> head_dim = fields.positive("head_dim")) config.head_dim = *head_dim;
}

// HF's attention_bias puts a bias on q, k, v and o alike.
void read_attention_bias(Fields& fields, AttentionConfig& config, bool default_bias) {
  const bool bias = fields.boolean("attention_bias").value_or(default_bias);
  config.qkv_bias = bias;
  config.output_bias = bias;
}

// The head dim the rotary fraction applies to, before resolve_defaults has run.
std::optional<int> head_dim_of(const AttentionConfig& config) {
  if (config.head_dim > 0) return config.head_dim;
  if (config.query_heads > 0 && config.hidden_size % config.query_heads == 0) {
    return config.hidden_size / config.query_heads;
  }
  return std::nullopt;
}

// HF partial rotary: int(head_dim * fraction) leading dimensions, rotate_half within them.
void set_rotary_fraction(Fields& fields, std::string_view key, double fraction, AttentionConfig& config) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    fields.problem(key, fmt::format("expected a fraction in (0, 1], got {}", fraction));
    return;
  }
  if (fraction == 1.0) return;
  if (const std::optional<int> head_dim = head_dim_of(config)) {
    config.rotary.dim = static_cast<int>(std::floor(*head_dim * fraction));
  }
}

struct Layer {
  int index = 0;
  std::optional<bool> sliding;  // set for models whose layers differ
};

void import_llama(Fields& f, Layer& layer, AttentionConfig& c) {
  f.irrelevant({"attention_dropout", "hidden_act", "intermediate_size", "mlp_bias", "pretraining_tp"});
  read_heads(f, c, /*kv_default_mha=*/true);
  read_attention_bias(f, c, false);
  c.input_norm.epsilon = f.number("rms_norm_eps").value_or(1e-6);
  c.rotary.theta = f.number("rope_theta").value_or(10000.0);
  c.rotary.scaling = read_rope_scaling(f);
  check_layer_range(f, "num_hidden_layers", layer.index);
}

void import_mistral(Fields& f, Layer& layer, AttentionConfig& c) {
  f.irrelevant({"attention_dropout", "hidden_act", "intermediate_size"});
  read_heads(f, c, /*kv_default_mha=*/false);
  c.input_norm.epsilon = f.number("rms_norm_eps").value_or(1e-6);
  c.rotary.theta = f.number("rope_theta").value_or(10000.0);
  c.rotary.scaling = read_rope_scaling(f);
  // Mistral windows every layer.
  if (const std::optional<int> window = f.positive("sliding_window")) c.sliding_window = *window;
  check_layer_range(f, "num_hidden_layers", layer.index);
}

// Qwen2 and Qwen3: sliding_window applies only with use_sliding_window, and then (without
// layer_types) to layers from max_window_layers on.
void read_qwen_window(Fields& f, Layer& layer, AttentionConfig& c) {
  const bool use_window = f.boolean("use_sliding_window").value_or(false);
  const std::optional<int> window = f.positive("sliding_window");
  const std::optional<int> max_window_layers = f.positive("max_window_layers");
  if (!use_window) {
    f.get("layer_types");  // all full_attention when windows are off, whatever it says
    return;
  }
  if (!window) {
    f.problem("sliding_window", "required when use_sliding_window is true");
    return;
  }
  const bool sliding =
      sliding_layer(f, layer.index, [&](int index) { return index >= max_window_layers.value_or(0); });
  layer.sliding = sliding;
  if (sliding) c.sliding_window = *window;
}

void import_qwen2(Fields& f, Layer& layer, AttentionConfig& c) {
  f.irrelevant({"attention_dropout", "hidden_act", "intermediate_size"});
  read_heads(f, c, /*kv_default_mha=*/false);
  c.qkv_bias = true;  // Qwen2 always has q/k/v biases and never an o bias
  c.input_norm.epsilon = f.number("rms_norm_eps").value_or(1e-6);
  c.rotary.theta = f.number("rope_theta").value_or(10000.0);
  c.rotary.scaling = read_rope_scaling(f);
  if (f.boolean("use_mrope").value_or(false)) {
    f.problem("use_mrope", "multimodal RoPE (Qwen2-VL) is not expressible in attnplan/v1");
  }
  read_qwen_window(f, layer, c);
  check_layer_range(f, "num_hidden_layers", layer.index);
}

void import_qwen3(Fields& f, Layer& layer, AttentionConfig& c) {
  f.irrelevant({"attention_dropout", "hidden_act", "intermediate_size"});
  read_heads(f, c, /*kv_default_mha=*/false);
  read_attention_bias(f, c, false);
  c.input_norm.epsilon = f.number("rms_norm_eps").value_or(1e-6);
  c.qkv_norm.query = true;  // q_norm / k_norm: plain w, the input norm's eps
  c.qkv_norm.key = true;
  c.rotary.theta = f.number("rope_theta").value_or(10000.0);
  c.rotary.scaling = read_rope_scaling(f);
  read_qwen_window(f, layer, c);
  check_layer_range(f, "num_hidden_layers", layer.index);
}

// What Gemma 2 and 3 share: 1 + w norms, head_dim 256 by default (not hidden / heads), the
// query_pre_attn_scalar^-0.5 scale and the optional tanh soft-cap of the scores.
void read_gemma_common(Fields& f, AttentionConfig& c, std::optional<double> default_softcap) {
  f.irrelevant({"attention_dropout", "cache_implementation", "final_logit_softcapping", "hidden_act",
                "hidden_activation", "intermediate_size"});
  read_heads(f, c, /*kv_default_mha=*/false);
  if (c.head_dim == 0) c.head_dim = 256;
  read_attention_bias(f, c, false);
  c.input_norm.epsilon = f.number("rms_norm_eps").value_or(1e-6);
  c.input_norm.weight_offset = 1.0;
  const double scalar = f.number("query_pre_attn_scalar").value_or(256.0);
  if (scalar > 0.0) {
    c.attention_scale = 1.0 / std::sqrt(scalar);
  } else {
    f.problem("query_pre_attn_scalar", fmt::format("expected a positive number, got {}", scalar));
  }
  const bool softcap_given = f.has("attn_logit_softcapping");
  if (const std::optional<double> softcap = f.number("attn_logit_softcapping")) {
    c.softcap = *softcap;
  } else if (!softcap_given) {
    c.softcap = default_softcap;
  }
}

void import_gemma2(Fields& f, Layer& layer, AttentionConfig& c) {
  read_gemma_common(f, c, /*default_softcap=*/50.0);
  c.rotary.theta = f.number("rope_theta").value_or(10000.0);
  c.rotary.scaling = read_rope_scaling(f);
  std::optional<int> window = f.positive("sliding_window");
  // An older name of the same window; two different values leave the layer ambiguous.
  if (const std::optional<int> older = f.positive("sliding_window_size")) {
    if (window && *window != *older) {
      f.problem("sliding_window_size", fmt::format("{} contradicts sliding_window {}", *older, *window));
    }
    if (!window) window = older;
  }
  // Gemma 2 alternates: even layers local (sliding), odd layers global.
  layer.sliding = sliding_layer(f, layer.index, [](int index) { return index % 2 == 0; });
  if (*layer.sliding) c.sliding_window = window.value_or(4096);
  check_layer_range(f, "num_hidden_layers", layer.index);
}

void import_gemma3_text(Fields& f, Layer& layer, AttentionConfig& c) {
  read_gemma_common(f, c, /*default_softcap=*/std::nullopt);
  c.qkv_norm.query = true;  // q_norm / k_norm with 1 + w, the input norm's eps
  c.qkv_norm.key = true;
  c.qkv_norm.weight_offset = 1.0;
  c.bidirectional_spans = true;  // image tokens attend both ways; harmless when no spans are passed
  if (f.boolean("use_bidirectional_attention").value_or(false)) {
    f.problem("use_bidirectional_attention",
              "fully bidirectional attention is not expressible in attnplan/v1");
  }
  const double global_theta = f.number("rope_theta").value_or(1e6);
  const RopeScaling global_scaling = read_rope_scaling(f);
  const double local_theta = f.number("rope_local_base_freq").value_or(10000.0);
  const int window = f.positive("sliding_window").value_or(4096);
  // Newer HF versions save the pattern under a private name beside layer_types.
  const std::optional<int> private_pattern = f.positive("_sliding_window_pattern");
  const int pattern = f.positive("sliding_window_pattern").value_or(private_pattern.value_or(6));
  // Every pattern-th layer (1-based) is global; the rest are local.
  layer.sliding = sliding_layer(f, layer.index, [&](int index) { return (index + 1) % pattern != 0; });
  if (*layer.sliding) {
    // Local layers use their own base frequency and no scaling (HF's rotary_emb_local).
    c.rotary.theta = local_theta;
    c.sliding_window = window;
  } else {
    c.rotary.theta = global_theta;
    c.rotary.scaling = global_scaling;
  }
  check_layer_range(f, "num_hidden_layers", layer.index);
}

void import_phi3(Fields& f, Layer& layer, AttentionConfig& c) {
  f.irrelevant({"attention_dropout", "embd_pdrop", "hidden_act", "intermediate_size", "lm_head_bias",
                "mlp_bias", "original_max_position_embeddings", "resid_pdrop"});
  read_heads(f, c, /*kv_default_mha=*/true);
  c.projection.fused_qkv = true;  // one qkv_proj tensor, [q; k; v]
  // HF Phi3 builds qkv_proj and o_proj without biases whatever the config says.
  if (f.boolean("attention_bias").value_or(false)) {
    f.problem("attention_bias", "true is not supported: HF Phi3 has no attention biases");
  }
  c.input_norm.epsilon = f.number("rms_norm_eps").value_or(1e-5);
  c.rotary.theta = f.number("rope_theta").value_or(10000.0);
  c.rotary.scaling = read_rope_scaling(f);
  set_rotary_fraction(f, "partial_rotary_factor", f.number("partial_rotary_factor").value_or(1.0), c);
  if (const std::optional<int> window = f.positive("sliding_window")) c.sliding_window = *window;
  check_layer_range(f, "num_hidden_layers", layer.index);
}

void import_gpt_oss(Fields& f, Layer& layer, AttentionConfig& c) {
  f.irrelevant({"attention_dropout", "experts_per_token", "hidden_act", "initial_context_length",
                "intermediate_size", "num_experts_per_tok", "num_local_experts", "output_router_logits",
                "router_aux_loss_coef", "swiglu_limit"});
  read_heads(f, c, /*kv_default_mha=*/false);
  if (c.head_dim == 0) c.head_dim = 64;
  read_attention_bias(f, c, true);
  c.sinks = true;  // one learned sink logit per query head on every layer
  c.input_norm.epsilon = f.number("rms_norm_eps").value_or(1e-5);
  c.rotary.theta = f.number("rope_theta").value_or(150000.0);
  c.rotary.scaling = read_rope_scaling(f);
  const int window = f.positive("sliding_window").value_or(128);
  layer.sliding = sliding_layer(f, layer.index, [](int index) { return index % 2 == 0; });
  if (*layer.sliding) c.sliding_window = window;
  check_layer_range(f, "num_hidden_layers", layer.index);
}

void import_gptj(Fields& f, Layer& layer, AttentionConfig& c, std::vector<std::string>& notes) {
  f.irrelevant({"activation_function", "attn_pdrop", "embd_pdrop", "gradient_checkpointing", "n_inner",
                "n_positions", "resid_pdrop", "summary_activation", "summary_first_dropout",
                "summary_proj_to_labels", "summary_type", "summary_use_proj"});
  c.hidden_size = f.required_positive("n_embd");
  c.query_heads = f.required_positive("n_head");
  c.kv_heads = c.query_heads;
  c.input_norm.epsilon = f.number("layer_norm_epsilon").value_or(1e-5);
  if (!f.boolean("rotary").value_or(true))
    f.problem("rotary", "false (no RoPE) is not supported by GPT-J import");
  // Without rotary_dim HF GPT-J derives its frequencies from the model width, not the head: no
  // attnplan/v1 rotary expresses that, so the field is required.
  if (f.has("rotary_dim")) {
    if (const std::optional<int> rotary_dim = f.positive("rotary_dim")) c.rotary.dim = *rotary_dim;
  } else {
    f.get("rotary_dim");
    f.problem("rotary_dim", "required: GPT-J without rotary_dim is not expressible in attnplan/v1");
  }
  c.rotary.pairing_dim = 2;  // rotate_every_two: interleaved pairs
  check_layer_range(f, "n_layer", layer.index);
  notes.push_back("GPT-J normalizes its input with LayerNorm; input_norm is an RMSNorm with its epsilon");
}

void import_gpt_neox(Fields& f, Layer& layer, AttentionConfig& c, std::vector<std::string>& notes) {
  f.irrelevant({"attention_dropout", "classifier_dropout", "hidden_act", "hidden_dropout",
                "intermediate_size", "use_parallel_residual"});
  read_heads(f, c, /*kv_default_mha=*/true);
  read_attention_bias(f, c, true);
  c.input_norm.epsilon = f.number("layer_norm_eps").value_or(1e-5);
  // Older and newer HF names of the same two values.
  const std::optional<double> base = f.number("rotary_emb_base");
  const std::optional<double> theta = f.number("rope_theta");
  if (base && theta && *base != *theta)
    f.problem("rope_theta", fmt::format("contradicts rotary_emb_base {}", *base));
  c.rotary.theta = theta.value_or(base.value_or(10000.0));
  const std::optional<double> pct = f.number("rotary_pct");
  const std::optional<double> factor = f.number("partial_rotary_factor");
  if (pct && factor && *pct != *factor) {
    f.problem("partial_rotary_factor", fmt::format("contradicts rotary_pct {}", *pct));
  }
  set_rotary_fraction(f, factor ? "partial_rotary_factor" : "rotary_pct", factor.value_or(pct.value_or(0.25)),
                      c);
  c.rotary.scaling = read_rope_scaling(f);
  check_layer_range(f, "num_hidden_layers", layer.index);
  notes.push_back(
      "GPT-NeoX normalizes its input with LayerNorm; input_norm is an RMSNorm with its epsilon. Its fused "
      "query_key_value weight interleaves q, k, v per head: split it into q/k/v before loading");
}

constexpr std::string_view kFamilies =
    "llama, mistral, qwen2, qwen3, gemma2, gemma3, gemma3_text, phi3, gpt_oss, gptj, gpt_neox";

std::string plural(std::size_t count, std::string_view word) {
  return fmt::format("{} {}{}", count, word, count == 1 ? "" : "s");
}

}  // namespace

AttentionConfig import_hf_config(const json& hf, int layer_index, std::vector<std::string>* notes) {
  if (!hf.is_object()) {
    throw Error(Stage::config, "1 problem in HF config", {},
                {fmt::format("/: expected an object, got {}", describe(hf))});
  }
  if (layer_index < 0)
    throw Error(Stage::input, fmt::format("layer {}: expected a layer index >= 0", layer_index));

  std::vector<std::string> problems;
  std::vector<std::string> caveats;
  Fields top(hf, "", problems);
  top.irrelevant_all(kGenericIrrelevant);
  // Read before the family's fields: gemma3 refuses its unknown top-level keys early.
  const detail::HfQuantization quantization = detail::read_hf_quantization(top);
  const std::optional<std::string> model_type = top.string("model_type");
  if (!model_type) {
    if (!top.has("model_type")) top.problem("model_type", fmt::format("required (one of {})", kFamilies));
    throw Error(Stage::config, plural(problems.size(), "problem") + " in HF config", {}, problems);
  }

  AttentionConfig config;
  Layer layer{layer_index, std::nullopt};
  std::string family = *model_type;
  // Gemma 3's multimodal config holds the language model's under text_config; the rest (vision
  // tower, image token ids) does not touch the text attention layers.
  std::optional<Fields> nested;
  Fields* fields = &top;
  if (family == "gemma3") {
    top.irrelevant({"boi_token_index", "eoi_token_index", "image_token_index", "mm_tokens_per_image",
                    "vision_config", "vision_feature_layer"});
    const json* text = top.get("text_config");
    if (text == nullptr || !text->is_object()) {
      top.problem("text_config", text == nullptr ? "required for gemma3" : "expected an object");
      throw Error(Stage::config, plural(problems.size(), "problem") + " in HF config", {}, problems);
    }
    top.refuse_unknown("gemma3");
    nested.emplace(*text, "/text_config", problems);
    nested->irrelevant_all(kGenericIrrelevant);
    if (const std::optional<std::string> text_type = nested->string("model_type");
        text_type && *text_type != "gemma3_text") {
      nested->problem("model_type", fmt::format("expected \"gemma3_text\", got \"{}\"", *text_type));
    }
    fields = &*nested;
    family = "gemma3_text";
  }

  Fields& f = *fields;
  if (family == "llama") {
    import_llama(f, layer, config);
  } else if (family == "mistral") {
    import_mistral(f, layer, config);
  } else if (family == "qwen2") {
    import_qwen2(f, layer, config);
  } else if (family == "qwen3") {
    import_qwen3(f, layer, config);
  } else if (family == "gemma2") {
    import_gemma2(f, layer, config);
  } else if (family == "gemma3_text") {
    import_gemma3_text(f, layer, config);
  } else if (family == "phi3") {
    import_phi3(f, layer, config);
  } else if (family == "gpt_oss") {
    import_gpt_oss(f, layer, config);
  } else if (family == "gptj") {
    import_gptj(f, layer, config, caveats);
  } else if (family == "gpt_neox") {
    import_gpt_neox(f, layer, config, caveats);
  } else {
    throw Error(Stage::config, "1 problem in HF config", {},
                {fmt::format("/model_type: \"{}\" is not supported by import-hf (supported: {})", family,
                             kFamilies)});
  }
  f.refuse_unknown(family);
  detail::apply_hf_quantization(quantization, layer_index, config, problems);
  caveats.insert(caveats.end(), quantization.notes.begin(), quantization.notes.end());
  if (!problems.empty()) {
    throw Error(Stage::config, plural(problems.size(), "problem") + " in HF config", {}, problems);
  }

  const json* name = hf.contains("_name_or_path") ? &hf["_name_or_path"] : nullptr;
  config.name = name != nullptr && name->is_string() && !name->get<std::string>().empty()
                    ? name->get<std::string>()
                    : *model_type;
  if (layer.sliding) {
    config.name +=
        fmt::format(" (layer {}: {})", layer.index, *layer.sliding ? "sliding window" : "full attention");
  }
  resolve_defaults(config);
  check(config, "the imported config");
  if (notes != nullptr) notes->insert(notes->end(), caveats.begin(), caveats.end());
  return config;
}

}  // namespace attnplan::config
