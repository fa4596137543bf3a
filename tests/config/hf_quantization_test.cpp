// import_hf_config's reading of quantized checkpoints (config/hf_quantization.hpp): one fixture per
// quantizer, shaped as the released config.json's `quantization_config` (or MLX's `quantization`), checked
// against the projection formats of plans/, plus the module patterns that keep projections in bf16 and
// every refusal naming its HF path.
#include "config/hf_quantization.hpp"

#include <filesystem>
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

// Llama-3.1-8B's attention fields; each test adds the quantizer's config.
const json kLlama = json::parse(R"({
  "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
  "num_hidden_layers": 32, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
})");

// hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4
const json kAwq = json::parse(R"({
  "bits": 4, "group_size": 128, "modules_to_not_convert": null, "quant_method": "awq", "version": "gemm",
  "zero_point": true
})");

// hugging-quants/Meta-Llama-3.1-8B-Instruct-GPTQ-INT4 (optimum's GPTQConfig.to_dict)
const json kGptq = json::parse(R"({
  "batch_size": 1, "bits": 4, "block_name_to_quantize": null, "cache_block_outputs": true,
  "damp_percent": 0.1, "dataset": null, "desc_act": true, "exllama_config": {"version": 1},
  "group_size": 128, "max_input_length": null, "model_seqlen": null,
  "module_name_preceding_first_block": null, "modules_in_block_to_quantize": null, "pad_token_id": null,
  "quant_method": "gptq", "sym": true, "tokenizer": null, "true_sequential": true, "use_cuda_fp16": false,
  "use_exllama": true
})");

// Qwen/Qwen3-8B-FP8 (HF FineGrainedFP8Config)
const json kFp8Block = json::parse(R"({
  "activation_scheme": "dynamic", "modules_to_not_convert": null, "fmt": "e4m3", "quant_method": "fp8",
  "weight_block_size": [128, 128]
})");

// openai/gpt-oss-20b
const json kMxfp4GptOss = json::parse(R"({
  "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                             "lm_head"],
  "quant_method": "mxfp4"
})");

// nvidia/Llama-3.1-8B-Instruct-FP4 (ModelOpt, flat in config.json)
const json kModeloptNvfp4 = json::parse(R"({
  "quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
  "exclude_modules": ["lm_head"], "producer": {"name": "modelopt", "version": "0.29.0"}
})");

// llm-compressor FP8-Dynamic with an fp8 KV cache (compressed-tensors)
const json kCompressedFp8 = json::parse(R"({
  "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
  "global_compression_ratio": null, "ignore": ["lm_head"],
  "config_groups": {"group_0": {
    "targets": ["Linear"], "output_activations": null,
    "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": false, "symmetric": true,
                "group_size": null, "block_structure": null, "observer": "minmax", "actorder": null},
    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true,
                          "symmetric": true, "group_size": null, "observer": null}}},
  "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false,
                      "symmetric": true, "group_size": null}
})");

// mlx-community/Meta-Llama-3.1-8B-Instruct-4bit (mlx-lm writes the same object twice)
const json kMlx = json::parse(R"({"group_size": 64, "bits": 4})");

json with(const json& quantization_config) {
  json hf = kLlama;
  hf["quantization_config"] = quantization_config;
  return hf;
}

AttentionConfig load_plan(const std::string& name) {
  return load_file(std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans" / (name + ".json"));
}

std::vector<std::string> problems_of(const json& hf, int layer = 0) {
  const Error error = expect_error([&] { import_hf_config(hf, layer); });
  CHECK(error.stage() == Stage::config);
  return error.details();
}

// The one problem of `hf`, which must start with `prefix`.
void require_only_problem(const json& hf, const std::string& prefix) {
  const std::vector<std::string> problems = problems_of(hf);
  CAPTURE(problems);
  REQUIRE(problems.size() == 1);
  CHECK(problems.front().starts_with(prefix));
}

const WeightEncoding kBf16{};

}  // namespace

TEST_CASE("AWQ, GPTQ, MLX and NVFP4 checkpoints import as their plans/ formats",
          "[config][hf_quantization]") {
  CHECK(import_hf_config(with(kAwq)).projection == load_plan("llama-3.1-8b-awq").projection);
  CHECK(import_hf_config(with(kGptq)).projection == load_plan("llama-3.1-8b-gptq").projection);

  json mlx = kLlama;
  mlx["quantization"] = kMlx;
  CHECK(import_hf_config(mlx).projection == load_plan("llama-3.1-8b-mlx-4bit").projection);
  mlx["quantization_config"] = kMlx;  // mlx-lm's copy for HF tools
  CHECK(import_hf_config(mlx).projection == load_plan("llama-3.1-8b-mlx-4bit").projection);

  const AttentionConfig nvfp4 = import_hf_config(with(kModeloptNvfp4));
  CHECK(nvfp4.projection == load_plan("llama-3.1-8b-nvfp4").projection);
  CHECK(nvfp4.kv_cache.dtype == KvCacheDtype::fp8_e4m3);
  CHECK_FALSE(nvfp4.kv_cache.k_scale.has_value());  // taken from the checkpoint at load time
  CHECK(parse(to_json(nvfp4), "round trip") == nvfp4);
}

TEST_CASE("fp8: block size, activation scheme and fmt", "[config][hf_quantization]") {
  std::vector<std::string> notes;
  const AttentionConfig block = import_hf_config(with(kFp8Block), 0, &notes);
  CHECK(block.projection.qkv == load_plan("qwen3-8b-fp8-block-fp8act").projection.qkv);
  CHECK(block.projection.output == block.projection.qkv);
  REQUIRE(notes.size() == 1);
  CHECK(contains(notes[0], "activation fp8"));

  json per_tensor = kFp8Block;  // AutoFP8: no block size, one scale per tensor
  per_tensor.erase("weight_block_size");
  CHECK(import_hf_config(with(per_tensor)).projection.qkv.scale_granularity == Fp8ScaleGranularity::tensor);

  json bad = kFp8Block;
  bad["activation_scheme"] = "static";
  require_only_problem(with(bad), "/quantization_config/activation_scheme: static is not supported");
  bad = kFp8Block;
  bad["weight_block_size"] = {64, 64};
  require_only_problem(with(bad), "/quantization_config/weight_block_size: [64,64] is not supported");
  bad = kFp8Block;
  bad["fmt"] = "e5m2";
  require_only_problem(with(bad), "/quantization_config/fmt: \"e5m2\" is not supported");
}

TEST_CASE("AWQ and GPTQ parameters", "[config][hf_quantization]") {
  json gptq = kGptq;
  gptq["checkpoint_format"] = "gptq_v2";
  gptq["desc_act"] = false;
  gptq["group_size"] = -1;
  gptq["bits"] = 8;
  const WeightEncoding v2 = import_hf_config(with(gptq)).projection.qkv;
  CHECK(v2.scheme == PackedIntegerScheme::gptq_v2);
  CHECK_FALSE(v2.act_order);
  CHECK(v2.group_size == -1);
  CHECK(v2.bits == 8);

  gptq["checkpoint_format"] = "marlin";
  require_only_problem(with(gptq), "/quantization_config/checkpoint_format: \"marlin\" is not supported");
  gptq = kGptq;
  gptq["bits"] = 3;
  require_only_problem(with(gptq), "/quantization_config/bits: 3: attnplan reads 4- or 8-bit GPTQ");

  json awq = kAwq;
  awq["version"] = "gemv";
  require_only_problem(with(awq), "/quantization_config/version: \"gemv\" is not supported");
  awq = kAwq;
  awq["zero_point"] = false;
  require_only_problem(with(awq), "/quantization_config/zero_point: false is not supported");
  awq = kAwq;
  awq["bits"] = 8;
  require_only_problem(with(awq), "/quantization_config/bits: 8: AWQ packs 4-bit values only");
  awq = kAwq;
  awq["frobnicate"] = true;
  require_only_problem(with(awq), "/quantization_config/frobnicate: not a parameter of quant_method awq");
}

TEST_CASE("modules left unconverted keep their projections in bf16", "[config][hf_quantization]") {
  // gpt-oss: every layer's attention is excluded.
  json hf = kLlama;
  hf["quantization_config"] = kMxfp4GptOss;
  const AttentionConfig gpt_oss = import_hf_config(hf, 5);
  CHECK(gpt_oss.projection.qkv == kBf16);
  CHECK(gpt_oss.projection.output == kBf16);

  // o_proj excluded alone: q/k/v quantized, o bf16.
  json awq = kAwq;
  awq["modules_to_not_convert"] = {"o_proj"};
  const AttentionConfig o_bf16 = import_hf_config(with(awq));
  CHECK(o_bf16.projection.qkv.format == WeightFormat::packed_integer);
  CHECK(o_bf16.projection.output == kBf16);

  // One layer's attention by its full name; other layers stay quantized.
  awq["modules_to_not_convert"] = {"model.layers.3.self_attn"};
  CHECK(import_hf_config(with(awq), 3).projection.qkv == kBf16);
  CHECK(import_hf_config(with(awq), 13).projection.qkv.format == WeightFormat::packed_integer);

  // compressed-tensors regexes.
  json compressed = kCompressedFp8;
  compressed["ignore"] = {"lm_head", "re:.*self_attn\\.(q|k|v|o)_proj$"};
  CHECK(import_hf_config(with(compressed)).projection.qkv == kBf16);

  // compressed-tensors targets other than Linear convert only what they name.
  compressed = kCompressedFp8;
  compressed["config_groups"]["group_0"]["targets"] = {"re:.*mlp.*", "re:.*o_proj"};
  const AttentionConfig targeted = import_hf_config(with(compressed));
  CHECK(targeted.projection.qkv == kBf16);
  CHECK(targeted.projection.output.format == WeightFormat::fp8);

  // GPTQ's modules_in_block_to_quantize lists what is converted.
  json gptq = kGptq;
  gptq["modules_in_block_to_quantize"] = {{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
                                          {"mlp.up_proj"}};
  const AttentionConfig listed = import_hf_config(with(gptq));
  CHECK(listed.projection.qkv.format == WeightFormat::packed_integer);
  CHECK(listed.projection.output == kBf16);

  // q/k/v share one format: keeping one of them is refused.
  awq["modules_to_not_convert"] = {"k_proj"};
  require_only_problem(with(awq),
                       "/quantization_config/modules_to_not_convert: keeps k_proj unquantized but "
                       "converts q_proj, v_proj (layer 0)");

  // MLX per-module switch.
  json mlx = kLlama;
  mlx["quantization"] = kMlx;
  mlx["quantization"]["model.layers.0.self_attn.o_proj"] = false;
  CHECK(import_hf_config(mlx).projection.output == kBf16);
  mlx["quantization"]["model.layers.0.self_attn.o_proj"] = {{"group_size", 32}, {"bits", 8}};
  require_only_problem(mlx, "/quantization/model.layers.0.self_attn.o_proj: per-module bits or group_size");
}

TEST_CASE("module patterns: dotted components, '*' within one, re: regexes", "[config][hf_quantization]") {
  using detail::names_module;
  const std::string q = "model.layers.12.self_attn.q_proj";
  CHECK(names_module("self_attn", q));
  CHECK(names_module("q_proj", q));
  CHECK(names_module("model.layers.*.self_attn", q));
  CHECK(names_module("model.layers.12", q));
  CHECK_FALSE(names_module("model.layers.1", q));  // not a prefix of "12"
  CHECK_FALSE(names_module("lm_head", q));
  CHECK_FALSE(names_module("mlp", q));
  CHECK(names_module("re:.*q_proj", q));
  CHECK(names_module("re:model\\.layers\\.1", q));  // re.match: anchored at the start only
  CHECK_FALSE(names_module("re:q_proj", q));
}

TEST_CASE("ModelOpt and compressed-tensors map what they can and name what they cannot",
          "[config][hf_quantization]") {
  const AttentionConfig compressed = import_hf_config(with(kCompressedFp8));
  CHECK(compressed.projection == load_plan("llama-3.1-8b-fp8-dynamic").projection);
  CHECK(compressed.projection.qkv.format == WeightFormat::fp8);
  CHECK(compressed.projection.qkv.scale_granularity == Fp8ScaleGranularity::channel);
  CHECK(compressed.projection.qkv.activation == ActivationType::fp8);
  CHECK(compressed.kv_cache.dtype == KvCacheDtype::fp8_e4m3);

  // Only a KV cache scheme: bf16 weights, fp8 cache (as plans/mistral-7b-fp8kv.json).
  json kv_only = {{"quant_method", "compressed-tensors"},
                  {"kv_cache_scheme", kCompressedFp8["kv_cache_scheme"]},
                  {"config_groups", json::object()}};
  const AttentionConfig kv = import_hf_config(with(kv_only));
  CHECK(kv.projection.qkv == kBf16);
  CHECK(kv.kv_cache.dtype == KvCacheDtype::fp8_e4m3);

  json packed = kCompressedFp8;
  packed["format"] = "pack-quantized";
  require_only_problem(with(packed), "/quantization_config/format: \"pack-quantized\" does not map");
  json block = kCompressedFp8;
  block["config_groups"]["group_0"]["weights"]["strategy"] = "block";
  require_only_problem(with(block),
                       "/quantization_config/config_groups/group_0/weights/strategy: \"block\" does not map");
  json static_inputs = kCompressedFp8;
  static_inputs["config_groups"]["group_0"]["input_activations"]["dynamic"] = false;
  require_only_problem(with(static_inputs),
                       "/quantization_config/config_groups/group_0/input_activations/dynamic: false");

  json fp8 = kModeloptNvfp4;
  fp8["quant_algo"] = "FP8";
  fp8.erase("group_size");
  std::vector<std::string> notes;
  const AttentionConfig modelopt_fp8 = import_hf_config(with(fp8), 0, &notes);
  CHECK(modelopt_fp8.projection == load_plan("llama-3.1-8b-fp8").projection);
  CHECK(modelopt_fp8.projection.qkv.format == WeightFormat::fp8);
  CHECK(modelopt_fp8.projection.qkv.activation == ActivationType::bf16);
  CHECK(notes.size() == 1);

  json mxfp8 = kModeloptNvfp4;
  mxfp8["quant_algo"] = "MXFP8";
  mxfp8.erase("group_size");
  CHECK(import_hf_config(with(mxfp8)).projection == load_plan("llama-3.1-8b-mxfp8").projection);

  // hf_quant_config.json's nesting under `quantization`.
  const json nested = {{"quant_method", "modelopt"},
                       {"quantization", {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}}}};
  CHECK(import_hf_config(with(nested)).projection.qkv.format == WeightFormat::nvfp4);

  json bad = kModeloptNvfp4;
  bad["quant_algo"] = "W4A8_AWQ";
  require_only_problem(with(bad), "/quantization_config/quant_algo: \"W4A8_AWQ\" is not supported");
  bad = kModeloptNvfp4;
  bad["kv_cache_quant_algo"] = "NVFP4";
  require_only_problem(with(bad), "/quantization_config/kv_cache_quant_algo: \"NVFP4\" is not supported");
}

TEST_CASE("an unknown or missing quant_method is named", "[config][hf_quantization]") {
  require_only_problem(with({{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}),
                       "/quantization_config/quant_method: \"bitsandbytes\" is not supported by import-hf "
                       "(supported: fp8, awq, gptq, mxfp4, modelopt, compressed-tensors)");
  require_only_problem(with({{"bits", 4}}), "/quantization_config/quant_method: required");
  require_only_problem(with(json::array()), "/quantization_config: expected an object");
}

}  // namespace attnplan::config
