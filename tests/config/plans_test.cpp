// Every config in plans/ parses, validates and round-trips; a few values per model are pinned to the
// HF configs they come from.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "config/parse.hpp"
#include "support/catch.hpp"

namespace attnplan::config {
namespace {

const std::filesystem::path kPlansDir = std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans";

AttentionConfig load_plan(const std::string& name) {
  return load_file(kPlansDir / (name + ".json"));
}

TEST_CASE("every plan parses, validates and round-trips through to_json", "[config][plans]") {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(kPlansDir)) {
    if (entry.path().extension() != ".json") continue;
    names.push_back(entry.path().stem().string());
    CAPTURE(entry.path().string());
    AttentionConfig config;
    REQUIRE_NOTHROW(config = load_file(entry.path()));
    CHECK(validate(config).empty());
    const nlohmann::json canonical = to_json(config);
    CHECK(parse(canonical) == config);
    CHECK(parse_text(canonical.dump(), "canonical") == config);
    CHECK(to_json(parse(canonical)) == canonical);
  }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"gemma-2-9b",
                                          "gemma-3-27b-global",
                                          "gemma-3-27b-local",
                                          "gpt-j-6b",
                                          "gpt-oss-20b-full",
                                          "gpt-oss-20b-mxfp4",
                                          "gpt-oss-20b-sliding",
                                          "llama-3.1-8b",
                                          "llama-3.1-8b-awq",
                                          "llama-3.1-8b-fp8",
                                          "llama-3.1-8b-fp8-dynamic",
                                          "llama-3.1-8b-gptq",
                                          "llama-3.1-8b-gptq-noact",
                                          "llama-3.1-8b-mlx-4bit",
                                          "llama-3.1-8b-mxfp8",
                                          "llama-3.1-8b-nvfp4",
                                          "mistral-7b",
                                          "mistral-7b-fp8kv",
                                          "phi-4-mini",
                                          "qwen2.5-7b",
                                          "qwen3-32b",
                                          "qwen3-8b",
                                          "qwen3-8b-fp8-block",
                                          "qwen3-8b-fp8-block-fp8act"});
}

TEST_CASE("plans carry the HF values", "[config][plans]") {
  SECTION("Llama-3.1-8B") {
    const AttentionConfig config = load_plan("llama-3.1-8b");
    CHECK(config.group_size() == 4);
    CHECK(config.rotary.theta == 500000.0);
    const RopeScaling& scaling = config.rotary.scaling;
    CHECK(scaling.type == RopeScalingType::llama3);
    CHECK(scaling.factor == 8.0);
    CHECK(scaling.low_freq_factor == 1.0);
    CHECK(scaling.high_freq_factor == 4.0);
    CHECK(scaling.original_max_position == 8192);
    CHECK(config.input_norm.epsilon == 1e-5);
  }
  SECTION("Qwen3") {
    for (const char* name : {"qwen3-8b", "qwen3-32b"}) {
      const AttentionConfig config = load_plan(name);
      CHECK(config.qkv_norm.query);
      CHECK(config.qkv_norm.key);
      CHECK_FALSE(config.qkv_norm.value);
      CHECK(config.qkv_norm.weight_offset == 0.0);
      CHECK(config.qkv_norm_epsilon() == 1e-6);
      CHECK(config.rotary.theta == 1e6);
    }
    CHECK(load_plan("qwen3-32b").query_heads == 64);
  }
  SECTION("Qwen2.5-7B: q/k/v biases, no o bias") {
    const AttentionConfig config = load_plan("qwen2.5-7b");
    CHECK(config.qkv_bias);
    CHECK_FALSE(config.output_bias);
    CHECK(config.group_size() == 7);
  }
  SECTION("Mistral-7B: a 4096 window") {
    CHECK(load_plan("mistral-7b").sliding_window == 4096);
    const AttentionConfig fp8kv = load_plan("mistral-7b-fp8kv");
    CHECK(fp8kv.kv_cache.dtype == KvCacheDtype::fp8_e4m3);
    CHECK(fp8kv.kv_cache.k_scale == 0.02);
    CHECK(fp8kv.sliding_window == 4096);
  }
  SECTION("Gemma 2 9B: the global layers' tanh soft-cap of the scores") {
    const AttentionConfig config = load_plan("gemma-2-9b");
    CHECK(config.head_dim == 256);
    CHECK(config.softcap == 50.0);
    CHECK(config.attention_scale == 0.0625);  // query_pre_attn_scalar 256
    CHECK(config.input_norm.weight_offset == 1.0);
    CHECK_FALSE(config.sliding_window);
    CHECK_FALSE(config.bidirectional_spans);
  }
  SECTION("Gemma 3 27B") {
    const AttentionConfig local = load_plan("gemma-3-27b-local");
    const AttentionConfig global = load_plan("gemma-3-27b-global");
    for (const AttentionConfig* config : {&local, &global}) {
      CHECK(config->head_dim == 128);  // not hidden / heads = 168
      CHECK(*config->attention_scale == Approx(1.0 / std::sqrt(168.0)).epsilon(1e-15));
      CHECK(config->input_norm.weight_offset == 1.0);
      CHECK(config->qkv_norm.weight_offset == 1.0);
      CHECK(config->bidirectional_spans);
    }
    CHECK(local.sliding_window == 1024);
    CHECK(local.rotary.theta == 1e4);
    CHECK(local.rotary.scaling.type == RopeScalingType::none);
    CHECK_FALSE(global.sliding_window);
    CHECK(global.rotary.theta == 1e6);
    CHECK(global.rotary.scaling.type == RopeScalingType::linear);
    CHECK(global.rotary.scaling.factor == 8.0);
  }
  SECTION("gpt-oss-20b") {
    const AttentionConfig sliding = load_plan("gpt-oss-20b-sliding");
    const AttentionConfig full = load_plan("gpt-oss-20b-full");
    CHECK(sliding.sliding_window == 128);
    CHECK_FALSE(full.sliding_window);
    AttentionConfig without_window = sliding;
    without_window.sliding_window.reset();
    without_window.name = full.name;
    CHECK(without_window == full);  // the layers differ by the window alone
    CHECK(full.sinks);
    CHECK(full.qkv_bias);
    CHECK(full.output_bias);
    CHECK(full.attention_scale == 0.125);
    const RopeScaling& scaling = full.rotary.scaling;
    CHECK(scaling.type == RopeScalingType::yarn);
    CHECK_FALSE(scaling.truncate);
    // The written attention_factor is HF's default for factor 32.
    CHECK(*scaling.attention_factor == Approx(0.1 * std::log(32.0) + 1.0).epsilon(1e-15));
  }
  SECTION("Phi-4-mini: partial rotary, fused qkv_proj") {
    const AttentionConfig config = load_plan("phi-4-mini");
    CHECK(config.rotary_dim() == 96);
    CHECK(config.pairing_dim() == 96);
    CHECK(config.projection.fused_qkv);
  }
  SECTION("GPT-J-6B: interleaved partial rotary") {
    const AttentionConfig config = load_plan("gpt-j-6b");
    CHECK(config.head_dim == 256);
    CHECK(config.rotary_dim() == 64);
    CHECK(config.pairing_dim() == 2);
    CHECK_FALSE(config.qkv_bias);
    CHECK_FALSE(config.output_bias);
  }
}

}  // namespace
}  // namespace attnplan::config
