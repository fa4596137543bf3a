// import_hf_config on HF config.json files as released (trimmed of nothing that matters), checked
// field by field against the plans/ written by hand from the same models, plus the refusals.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/hf_import.hpp"
#include "config/parse.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

namespace attnplan::config {
namespace {

using nlohmann::json;

AttentionConfig load_plan(const std::string& name) {
  return load_file(std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans" / (name + ".json"));
}

AttentionConfig import_text(const char* text, int layer = 0) {
  return import_hf_config(json::parse(text), layer);
}

void check_optional(const std::optional<double>& imported, const std::optional<double>& expected) {
  REQUIRE(imported.has_value() == expected.has_value());
  if (expected) CHECK(*imported == Approx(*expected).epsilon(1e-15));
}

// Every attention field, one CHECK each, so a mismatch names the field; the name is free text.
void check_same_attention(const AttentionConfig& imported, const AttentionConfig& plan) {
  CHECK(imported.hidden_size == plan.hidden_size);
  CHECK(imported.query_heads == plan.query_heads);
  CHECK(imported.kv_heads == plan.kv_heads);
  CHECK(imported.head_dim == plan.head_dim);
  CHECK(imported.value_head_dim == plan.value_head_dim);
  CHECK(imported.input_norm.epsilon == plan.input_norm.epsilon);
  CHECK(imported.input_norm.weight_offset == plan.input_norm.weight_offset);
  CHECK(imported.qkv_bias == plan.qkv_bias);
  CHECK(imported.output_bias == plan.output_bias);
  CHECK(imported.qkv_norm.query == plan.qkv_norm.query);
  CHECK(imported.qkv_norm.key == plan.qkv_norm.key);
  CHECK(imported.qkv_norm.value == plan.qkv_norm.value);
  CHECK(imported.qkv_norm.weight_offset == plan.qkv_norm.weight_offset);
  CHECK(imported.qkv_norm_epsilon() == plan.qkv_norm_epsilon());
  CHECK(imported.rotary.offset == plan.rotary.offset);
  CHECK(imported.rotary_dim() == plan.rotary_dim());
  CHECK(imported.pairing_dim() == plan.pairing_dim());
  CHECK(imported.rotary.theta == plan.rotary.theta);
  const RopeScaling& got = imported.rotary.scaling;
  const RopeScaling& want = plan.rotary.scaling;
  CHECK(got.type == want.type);
  CHECK(got.factor == want.factor);
  CHECK(got.low_freq_factor == want.low_freq_factor);
  CHECK(got.high_freq_factor == want.high_freq_factor);
  CHECK(got.original_max_position == want.original_max_position);
  CHECK(got.beta_fast == want.beta_fast);
  CHECK(got.beta_slow == want.beta_slow);
  CHECK(got.truncate == want.truncate);
  check_optional(got.attention_factor, want.attention_factor);
  check_optional(imported.attention_scale, plan.attention_scale);
  check_optional(imported.softcap, plan.softcap);
  CHECK(imported.sliding_window == plan.sliding_window);
  CHECK(imported.bidirectional_spans == plan.bidirectional_spans);
  CHECK(imported.sinks == plan.sinks);
  CHECK(imported.projection == plan.projection);
  CHECK(imported.kv_cache == plan.kv_cache);
  CHECK(imported.max_tokens == plan.max_tokens);
  CHECK(imported.target == plan.target);
}

// The imported config's canonical JSON reads back to the same config.
void check_round_trip(const AttentionConfig& imported) {
  CHECK(parse(to_json(imported), "round trip") == imported);
}

// ---- HF config.json fixtures ----------------------------------------------------------------------

constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
})";

constexpr const char* kQwen25_7B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 152064
})";

constexpr const char* kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
})";

constexpr const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000
})";

constexpr const char* kGemma2_9B = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2",
  "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
  "sliding_window_size": 4096, "torch_dtype": "float32", "transformers_version": "4.42.0.dev0",
  "use_cache": true, "vocab_size": 256000
})";

// As released: the text config leaves rope_theta, rope_local_base_freq, rms_norm_eps and the layer
// pattern to Gemma3TextConfig's defaults.
constexpr const char* kGemma3_27B = R"({
  "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
  "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
  "mm_tokens_per_image": 256, "model_type": "gemma3",
  "text_config": {
    "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024
  },
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
  "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                    "model_type": "siglip_vision_model", "num_attention_heads": 16,
                    "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}
})";

// Phi-4-mini's shapes with plain RoPE (the released config uses longrope, refused below) and no
// window (released: 262144, past its context).
constexpr const char* kPhi4MiniPlainRope = R"({
  "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "hidden_act": "silu",
  "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "lm_head_bias": false,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "phi3", "num_attention_heads": 24,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "original_max_position_embeddings": 4096,
  "pad_token_id": 199999, "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.45.0", "use_cache": true, "vocab_size": 200064
})";

// gpt-oss-20b without its quantization_config (the bf16 re-export); the released one quantizes only the
// MoE experts (tests/config/hf_quantization_test.cpp reads such configs).
constexpr const char* kGptOss20B = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
                  "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                  "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                  "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                  "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                  "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
  "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
  "output_router_logits": false, "pad_token_id": 199999, "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
  "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0", "use_cache": true,
  "vocab_size": 201088
})";

constexpr const char* kGptJ6B = R"({
  "activation_function": "gelu_new", "architectures": ["GPTJForCausalLM"], "attn_pdrop": 0.0,
  "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256, "gradient_checkpointing": false,
  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gptj", "n_embd": 4096,
  "n_head": 16, "n_inner": null, "n_layer": 28, "n_positions": 2048, "resid_pdrop": 0.0, "rotary": true,
  "rotary_dim": 64, "summary_activation": null, "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true, "summary_type": "cls_index", "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50, "temperature": 1.0}},
  "tie_word_embeddings": false, "tokenizer_class": "GPT2Tokenizer", "transformers_version": "4.18.0.dev0",
  "use_cache": true, "vocab_size": 50400
})";

constexpr const char* kPythia410M = R"({
  "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 4096, "layer_norm_eps": 1e-05,
  "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 16,
  "num_hidden_layers": 24, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
  "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": true,
  "use_parallel_residual": true, "vocab_size": 50304
})";

// ---- the families, against plans/ ---------------------------------------------------------------

TEST_CASE("Llama 3.1 imports as plans/llama-3.1-8b.json (llama3 rope scaling)", "[config][hf_import]") {
  const AttentionConfig imported = import_text(kLlama31_8B);
  check_same_attention(imported, load_plan("llama-3.1-8b"));
  CHECK(imported.rotary.scaling.type == RopeScalingType::llama3);
  CHECK(imported.rotary.scaling.original_max_position == 8192);
  CHECK(imported.name == "llama");  // no _name_or_path: the family
  check_round_trip(imported);
}

TEST_CASE("Llama with linear rope scaling and the older `type` key", "[config][hf_import]") {
  json hf = json::parse(kLlama31_8B);
  hf["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  hf["_name_or_path"] = "my-llama";
  const AttentionConfig imported = import_hf_config(hf, 0);
  CHECK(imported.rotary.scaling.type == RopeScalingType::linear);
  CHECK(imported.rotary.scaling.factor == 4.0);
  CHECK(imported.name == "my-llama");
}

TEST_CASE("Qwen2.5 imports as plans/qwen2.5-7b.json (q/k/v biases, no o bias)", "[config][hf_import]") {
  const AttentionConfig imported = import_text(kQwen25_7B);
  check_same_attention(imported, load_plan("qwen2.5-7b"));
  CHECK(imported.qkv_bias);
  CHECK_FALSE(imported.output_bias);
  CHECK_FALSE(imported.sliding_window.has_value());  // sliding_window is off without use_sliding_window
}

TEST_CASE("Qwen with use_sliding_window windows the layers from max_window_layers on",
          "[config][hf_import]") {
  json hf = json::parse(kQwen25_7B);
  hf["use_sliding_window"] = true;
  hf["sliding_window"] = 4096;
  hf["max_window_layers"] = 20;
  CHECK_FALSE(import_hf_config(hf, 19).sliding_window.has_value());
  CHECK(import_hf_config(hf, 20).sliding_window == 4096);
}

TEST_CASE("Qwen3 imports as plans/qwen3-8b.json (plain-w q/k norm)", "[config][hf_import]") {
  const AttentionConfig imported = import_text(kQwen3_8B);
  check_same_attention(imported, load_plan("qwen3-8b"));
  CHECK(imported.qkv_norm.query);
  CHECK(imported.qkv_norm.key);
  CHECK(imported.qkv_norm.weight_offset == 0.0);
  CHECK(imported.qkv_norm_epsilon() == 1e-6);
  check_round_trip(imported);
}

TEST_CASE("Mistral imports as plans/mistral-7b.json (window on every layer)", "[config][hf_import]") {
  const AttentionConfig imported = import_text(kMistral7B);
  check_same_attention(imported, load_plan("mistral-7b"));
  CHECK(imported.sliding_window == 4096);
  CHECK(import_text(kMistral7B, 31).sliding_window == 4096);
}

TEST_CASE("Gemma 2: softcap, query_pre_attn_scalar, 1 + w norm, alternating windows", "[config][hf_import]") {
  const AttentionConfig local = import_text(kGemma2_9B, 0);
  CHECK(local.hidden_size == 3584);
  CHECK(local.query_heads == 16);
  CHECK(local.kv_heads == 8);
  CHECK(local.head_dim == 256);
  CHECK(local.input_norm.epsilon == 1e-6);
  CHECK(local.input_norm.weight_offset == 1.0);
  CHECK_FALSE(local.qkv_norm.query);
  CHECK(local.softcap == 50.0);
  CHECK(local.attention_scale == 0.0625);  // 256^-0.5
  CHECK(local.sliding_window == 4096);
  CHECK(local.rotary.theta == 10000.0);
  CHECK(local.rotary.scaling.type == RopeScalingType::none);
  const AttentionConfig global = import_text(kGemma2_9B, 1);
  check_same_attention(global, load_plan("gemma-2-9b"));
  CHECK_FALSE(global.sliding_window.has_value());
  CHECK(global.softcap == 50.0);
  check_round_trip(global);
}

TEST_CASE("Gemma 3 (nested text_config) imports as both gemma-3-27b plans", "[config][hf_import]") {
  // Every 6th layer (5, 11, ...) is global: rope_theta with linear x8; the others local.
  const AttentionConfig local = import_text(kGemma3_27B, 0);
  check_same_attention(local, load_plan("gemma-3-27b-local"));
  CHECK(local.sliding_window == 1024);
  CHECK(local.rotary.theta == 10000.0);
  CHECK(local.rotary.scaling.type == RopeScalingType::none);
  CHECK(local.qkv_norm.weight_offset == 1.0);
  CHECK(local.bidirectional_spans);

  const AttentionConfig global = import_text(kGemma3_27B, 5);
  check_same_attention(global, load_plan("gemma-3-27b-global"));
  CHECK_FALSE(global.sliding_window.has_value());
  CHECK(global.rotary.theta == 1e6);
  CHECK(global.rotary.scaling.type == RopeScalingType::linear);
  CHECK(global.rotary.scaling.factor == 8.0);
  CHECK(global.name == "gemma3 (layer 5: full attention)");
  check_round_trip(global);

  CHECK(import_text(kGemma3_27B, 4).sliding_window == 1024);
  CHECK_FALSE(import_text(kGemma3_27B, 11).sliding_window.has_value());
}

TEST_CASE("Gemma 3 text-only config: layer_types and explicit local base frequency", "[config][hf_import]") {
  json text = json::parse(kGemma3_27B)["text_config"];
  text["layer_types"] = {"full_attention", "sliding_attention"};
  text["rope_local_base_freq"] = 20000.0;
  text["rms_norm_eps"] = 1e-5;
  const AttentionConfig global = import_hf_config(text, 0);
  CHECK_FALSE(global.sliding_window.has_value());
  CHECK(global.input_norm.epsilon == 1e-5);
  CHECK(global.qkv_norm_epsilon() == 1e-5);
  const AttentionConfig local = import_hf_config(text, 1);
  CHECK(local.sliding_window == 1024);
  CHECK(local.rotary.theta == 20000.0);
}

TEST_CASE("Phi-3-style config imports as plans/phi-4-mini.json (fused qkv, partial rotary)",
          "[config][hf_import]") {
  const AttentionConfig imported = import_text(kPhi4MiniPlainRope);
  check_same_attention(imported, load_plan("phi-4-mini"));
  CHECK(imported.projection.fused_qkv);
  CHECK(imported.rotary_dim() == 96);
  CHECK(imported.pairing_dim() == 96);
}

TEST_CASE("gpt-oss imports as both gpt-oss-20b plans (yarn, sinks, biases)", "[config][hf_import]") {
  const AttentionConfig sliding = import_text(kGptOss20B, 0);
  check_same_attention(sliding, load_plan("gpt-oss-20b-sliding"));
  CHECK(sliding.sliding_window == 128);
  CHECK(sliding.sinks);
  CHECK(sliding.qkv_bias);
  CHECK(sliding.output_bias);
  CHECK(sliding.rotary.scaling.type == RopeScalingType::yarn);
  CHECK_FALSE(sliding.rotary.scaling.truncate);

  const AttentionConfig full = import_text(kGptOss20B, 1);
  check_same_attention(full, load_plan("gpt-oss-20b-full"));
  CHECK_FALSE(full.sliding_window.has_value());
  check_round_trip(full);
}

TEST_CASE("GPT-J imports as plans/gpt-j-6b.json (interleaved pairs)", "[config][hf_import]") {
  std::vector<std::string> notes;
  const AttentionConfig imported = import_hf_config(json::parse(kGptJ6B), 0, &notes);
  check_same_attention(imported, load_plan("gpt-j-6b"));
  CHECK(imported.rotary_dim() == 64);
  CHECK(imported.pairing_dim() == 2);
  REQUIRE(notes.size() == 1);
  CHECK(contains(notes.front(), "LayerNorm"));
}

TEST_CASE("GPT-NeoX (Pythia) imports with rotary_pct and biases", "[config][hf_import]") {
  const AttentionConfig imported = import_text(kPythia410M);
  CHECK(imported.hidden_size == 1024);
  CHECK(imported.query_heads == 16);
  CHECK(imported.kv_heads == 16);
  CHECK(imported.head_dim == 64);
  CHECK(imported.rotary_dim() == 16);   // 64 * 0.25
  CHECK(imported.pairing_dim() == 16);  // rotate_half within the rotated part
  CHECK(imported.rotary.theta == 10000.0);
  CHECK(imported.qkv_bias);
  CHECK(imported.output_bias);
  CHECK(imported.input_norm.epsilon == 1e-5);
  CHECK_FALSE(imported.projection.fused_qkv);  // query_key_value interleaves per head, not [q; k; v]
  check_round_trip(imported);
}

// ---- refusals -----------------------------------------------------------------------------------

std::vector<std::string> problems_of(const json& hf, int layer = 0) {
  const Error error = expect_error([&] { import_hf_config(hf, layer); });
  CHECK(error.stage() == Stage::config);
  return error.details();
}

bool has_line(const std::vector<std::string>& lines, const std::string& prefix) {
  for (const std::string& line : lines) {
    if (line.starts_with(prefix)) return true;
  }
  return false;
}

TEST_CASE("fields unknown to the family are listed, not dropped", "[config][hf_import]") {
  json hf = json::parse(kLlama31_8B);
  hf["foo"] = 1;
  hf["bar"] = "x";
  const std::vector<std::string> problems = problems_of(hf);
  CAPTURE(problems);
  REQUIRE(problems.size() == 1);
  CHECK(problems.front() == "unsupported HF config fields for llama: bar, foo");

  // A field that matters to another family is still unknown here.
  json mistral = json::parse(kMistral7B);
  mistral["attn_logit_softcapping"] = 30.0;
  CHECK(has_line(problems_of(mistral), "unsupported HF config fields for mistral: attn_logit_softcapping"));

  json gemma = json::parse(kGemma3_27B);
  gemma["text_config"]["foo"] = true;
  CHECK(
      has_line(problems_of(gemma), "unsupported HF config fields for gemma3_text (under /text_config): foo"));
}

TEST_CASE("rope types attnplan/v1 cannot express are refused by their path", "[config][hf_import]") {
  json phi = json::parse(kPhi4MiniPlainRope);
  phi["rope_scaling"] = {{"rope_type", "longrope"},
                         {"long_factor", json::array({1.0, 1.1})},
                         {"short_factor", json::array({1.0, 1.0})}};
  std::vector<std::string> problems = problems_of(phi);
  CAPTURE(problems);
  REQUIRE(problems.size() == 1);
  CHECK(problems.front().starts_with("/rope_scaling/rope_type: longrope is not expressible in attnplan/v1"));

  // Phi-4-mini as released writes the older key.
  phi["rope_scaling"] = {{"type", "longrope"}, {"long_factor", json::array({1.0})}};
  CHECK(has_line(problems_of(phi), "/rope_scaling/type: longrope is not expressible"));

  json llama = json::parse(kLlama31_8B);
  llama["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  CHECK(has_line(problems_of(llama), "/rope_scaling/rope_type: dynamic is not expressible"));
  llama["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}};
  CHECK(has_line(problems_of(llama), "/rope_scaling/low_freq_factor: not a parameter of rope type linear"));
  llama["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 40.0}, {"mscale", 1.0}};
  CHECK(has_line(problems_of(llama), "/rope_scaling/mscale: DeepSeek-style yarn"));
  llama["rope_scaling"] = {{"rope_type", "linear"}};
  CHECK(has_line(problems_of(llama), "/rope_scaling/factor: required for rope type linear"));
}

TEST_CASE("gpt-oss's quantization_config keeps its attention in bf16", "[config][hf_import]") {
  json hf = json::parse(kGptOss20B);
  hf["quantization_config"] = {
      {"modules_to_not_convert",
       {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
      {"quant_method", "mxfp4"}};
  check_same_attention(import_hf_config(hf, 1), load_plan("gpt-oss-20b-full"));
}

TEST_CASE("missing, mistyped and contradicting fields name their path, all at once", "[config][hf_import]") {
  json hf = json::parse(kQwen3_8B);
  hf.erase("num_attention_heads");
  hf["rms_norm_eps"] = "1e-6";
  hf["frobnicate"] = 1;
  const std::vector<std::string> problems = problems_of(hf);
  CAPTURE(problems);
  CHECK(problems.size() == 3);
  CHECK(has_line(problems, "/num_attention_heads: required"));
  CHECK(has_line(problems, "/rms_norm_eps: expected a number, got string \"1e-6\""));
  CHECK(has_line(problems, "unsupported HF config fields for qwen3: frobnicate"));

  json qwen2 = json::parse(kQwen25_7B);
  qwen2.erase("num_key_value_heads");  // Qwen2Config's own default (32) is no guess to make
  CHECK(has_line(problems_of(qwen2), "/num_key_value_heads: required"));

  json gptj = json::parse(kGptJ6B);
  gptj.erase("rotary_dim");
  CHECK(has_line(problems_of(gptj), "/rotary_dim: required"));
}

TEST_CASE("model_type, layer and layer_types are checked", "[config][hf_import]") {
  json hf = json::parse(kLlama31_8B);
  hf["model_type"] = "deepseek_v3";
  CHECK(has_line(problems_of(hf), "/model_type: \"deepseek_v3\" is not supported by import-hf"));
  hf.erase("model_type");
  CHECK(has_line(problems_of(hf), "/model_type: required"));

  CHECK(has_line(problems_of(json::parse(kQwen3_8B), 36), "/num_hidden_layers: layer 36 is out of range"));
  json oss = json::parse(kGptOss20B);
  oss["layer_types"][2] = "chunked_attention";
  CHECK(has_line(problems_of(oss, 2), "/layer_types/2: string \"chunked_attention\" is not expressible"));

  const Error negative = expect_error([] { import_text(kLlama31_8B, -1); });
  CHECK(negative.stage() == Stage::input);
  const Error not_object = expect_error([] { import_hf_config(json::array(), 0); });
  CHECK(not_object.stage() == Stage::config);
}

TEST_CASE("a value attnplan/v1 refuses is reported by attnplan's own rule", "[config][hf_import]") {
  json hf = json::parse(kMistral7B);
  hf["num_key_value_heads"] = 5;  // does not divide 32: the importer passes it on, validation refuses
  const Error error = expect_error([&] { import_hf_config(hf, 0); });
  CHECK(error.stage() == Stage::config);
  CHECK(has_line(error.details(), "/kv_heads: 5 does not divide query_heads 32"));
}

}  // namespace
}  // namespace attnplan::config
