// One failing case (at least) per validation rule, each with the exact path and rule it reports,
// and the boundary values that pass.
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config/limits.hpp"
#include "config/parse.hpp"
#include "config_testing.hpp"
#include "support/catch.hpp"

namespace attnplan::config {
namespace {

using nlohmann::json;
using testing::document_with;
using testing::has_problem;
using testing::problems_of;
using testing::require_only_problem;

void require_valid(const json& document) {
  CAPTURE(document.dump());
  CHECK(problems_of(document) == std::vector<std::string>{});
}

json rotary(const json& fields) {
  return document_with({{"rotary", fields}});
}
json scaling(const json& fields) {
  return document_with({{"rotary", {{"scaling", fields}}}});
}
json projection(const json& fields) {
  return document_with({{"projection", fields}});
}

TEST_CASE("hidden_size: a multiple of 8 within range", "[config][rules]") {
  require_only_problem(
      document_with({{"hidden_size", 4100}, {"head_dim", 128}}),
      "/hidden_size: 4100 is not a multiple of 8 (kernels move rows in 16-byte vectors of 8 bf16)");
  require_only_problem(document_with({{"hidden_size", 70000}, {"head_dim", 128}}),
                       "/hidden_size: 70000 is outside the supported range 8..65536");
  require_valid(document_with({{"hidden_size", 8}, {"query_heads", 1}, {"head_dim", 64}}));
  require_valid(document_with({{"hidden_size", limits::kMaxHiddenSize}, {"query_heads", 128}}));
}

TEST_CASE("query_heads and kv_heads: kv_heads divides query_heads", "[config][rules]") {
  require_only_problem(document_with({{"kv_heads", 5}}), "/kv_heads: 5 does not divide query_heads 32");
  require_only_problem(document_with({{"kv_heads", 64}}), "/kv_heads: 64 does not divide query_heads 32");
  require_only_problem(document_with({{"query_heads", 2048}, {"head_dim", 128}}),
                       "/query_heads: 2048 is outside the supported range 1..1024");
  require_valid(document_with({{"kv_heads", 1}}));
  require_valid(document_with({{"kv_heads", 32}}));
}

TEST_CASE("head_dim and value_head_dim: 16..512, multiples of 8", "[config][rules]") {
  require_only_problem(
      document_with({{"hidden_size", 4000}, {"query_heads", 48}}),
      "/head_dim: no default: hidden_size 4000 is not a multiple of query_heads 48; set head_dim");
  require_valid(document_with({{"hidden_size", 4000}, {"query_heads", 48}, {"head_dim", 64}}));
  require_only_problem(document_with({{"head_dim", 8}}),
                       "/head_dim: 8 is outside the supported range 16..512");
  require_only_problem(document_with({{"head_dim", 520}}),
                       "/head_dim: 520 is outside the supported range 16..512");
  require_only_problem(document_with({{"head_dim", 100}}), "/head_dim: 100 is not a multiple of 8");
  require_only_problem(document_with({{"hidden_size", 4032}, {"query_heads", 48}}),  // default 84
                       "/head_dim: 84 is not a multiple of 8");
  require_only_problem(document_with({{"value_head_dim", 100}}),
                       "/value_head_dim: 100 is not a multiple of 8");
  require_only_problem(document_with({{"value_head_dim", 1024}}),
                       "/value_head_dim: 1024 is outside the supported range 16..512");
  require_valid(document_with({{"head_dim", 16}}));
  require_valid(document_with({{"head_dim", 512}, {"value_head_dim", 80}}));
}

TEST_CASE("norms: epsilon positive, weight_offset 0 or 1", "[config][rules]") {
  require_only_problem(document_with({{"input_norm", {{"epsilon", 0}}}}),
                       "/input_norm/epsilon: must be positive, got 0");
  require_only_problem(document_with({{"input_norm", {{"epsilon", -1e-6}}}}),
                       "/input_norm/epsilon: must be positive, got -1e-06");
  require_only_problem(document_with({{"input_norm", {{"weight_offset", 0.5}}}}),
                       "/input_norm/weight_offset: must be 0 or 1, got 0.5");
  require_only_problem(document_with({{"qkv_norm", {{"weight_offset", 2}}}}),
                       "/qkv_norm/weight_offset: must be 0 or 1, got 2");
  require_only_problem(document_with({{"qkv_norm", {{"epsilon", 0}}}}),
                       "/qkv_norm/epsilon: must be positive, got 0");
  require_valid(
      document_with({{"input_norm", {{"weight_offset", 1}}}, {"qkv_norm", {{"weight_offset", 1}}}}));
}

TEST_CASE("rotary offset and dim: o + R <= D, R even", "[config][rules]") {
  require_only_problem(rotary({{"offset", -1}}), "/rotary/offset: -1 is outside 0..head_dim 128");
  require_only_problem(rotary({{"offset", 130}}), "/rotary/offset: 130 is outside 0..head_dim 128");
  require_only_problem(rotary({{"dim", -2}}), "/rotary/dim: must be >= 0 (0 disables RoPE), got -2");
  require_only_problem(rotary({{"dim", 63}, {"pairing_dim", 2}}), "/rotary/dim: 63 is odd");
  require_only_problem(rotary({{"offset", 64}, {"dim", 80}}),
                       "/rotary/dim: offset 64 + dim 80 = 144 exceeds head_dim 128");
  require_only_problem(rotary({{"dim", 130}}), "/rotary/dim: offset 0 + dim 130 = 130 exceeds head_dim 128");
  require_valid(rotary({{"offset", 128}, {"dim", 0}}));
  require_valid(rotary({{"offset", 128}}));  // the default dim is what is left: none
  require_valid(rotary({{"dim", 0}}));       // RoPE disabled
}

TEST_CASE("rotary pairing_dim: even, >= 2, divides R when <= R, partners inside the head",
          "[config][rules]") {
  require_only_problem(rotary({{"pairing_dim", 6}, {"dim", 64}}),
                       "/rotary/pairing_dim: 6 does not divide rotary dim 64");
  require_only_problem(rotary({{"pairing_dim", 3}}), "/rotary/pairing_dim: must be even and >= 2, got 3");
  require_only_problem(rotary({{"pairing_dim", 0}}), "/rotary/pairing_dim: must be even and >= 2, got 0");
  // P2 > R: pairs (i, i + P2/2) for the first R/2 dims of the block; with an offset they can leave the head.
  require_only_problem(
      rotary({{"offset", 64}, {"dim", 64}, {"pairing_dim", 128}}),
      "/rotary/pairing_dim: 128 pairs dimension 95 with 159, past head_dim 128 (offset 64, dim 64)");
  require_valid(rotary({{"dim", 64}, {"pairing_dim", 128}}));                  // highest partner 95
  require_valid(rotary({{"offset", 32}, {"dim", 64}, {"pairing_dim", 128}}));  // highest partner 127
  require_only_problem(rotary({{"offset", 34}, {"dim", 64}, {"pairing_dim", 128}}),
                       "/rotary/pairing_dim: 128 pairs dimension 65 with 129, past head_dim 128");
  require_valid(rotary({{"dim", 64}, {"pairing_dim", 2}}));   // GPT-J, interleaved
  require_valid(rotary({{"dim", 96}, {"pairing_dim", 32}}));  // blocks of 32
  require_valid(
      document_with({{"head_dim", 192}, {"rotary", {{"offset", 128}, {"dim", 64}, {"pairing_dim", 2}}}}));
  // With RoPE disabled there are no pairs to check.
  require_valid(rotary({{"dim", 0}, {"pairing_dim", 2}}));
}

TEST_CASE("rotary theta > 1", "[config][rules]") {
  require_only_problem(rotary({{"theta", 1}}), "/rotary/theta: must be greater than 1, got 1");
  require_only_problem(rotary({{"theta", -10000}}), "/rotary/theta: must be greater than 1, got -10000");
}

TEST_CASE("rotary scaling parameters", "[config][rules]") {
  require_only_problem(scaling({{"type", "linear"}, {"factor", 0}}),
                       "/rotary/scaling/factor: must be positive for linear scaling, got 0");

  const json llama3 = {{"type", "llama3"}, {"factor", 8}, {"original_max_position", 8192}};
  require_valid(scaling(llama3));
  const auto llama3_with = [&](const json& patch) {
    json fields = llama3;
    fields.update(patch);
    return scaling(fields);
  };
  require_only_problem(llama3_with({{"factor", -8}}),
                       "/rotary/scaling/factor: must be positive for llama3 scaling, got -8");
  require_only_problem(llama3_with({{"original_max_position", 0}}),
                       "/rotary/scaling/original_max_position: must be positive for llama3 scaling, got 0");
  require_only_problem(llama3_with({{"low_freq_factor", 0}, {"high_freq_factor", 4}}),
                       "/rotary/scaling/low_freq_factor: must be positive for llama3 scaling, got 0");
  require_only_problem(llama3_with({{"low_freq_factor", 4}, {"high_freq_factor", 4}}),
                       "/rotary/scaling/high_freq_factor: 4 must be greater than low_freq_factor 4");

  const json yarn = {{"type", "yarn"}, {"factor", 32}, {"original_max_position", 4096}};
  require_valid(scaling(yarn));
  const auto yarn_with = [&](const json& patch) {
    json fields = yarn;
    fields.update(patch);
    return scaling(fields);
  };
  require_only_problem(yarn_with({{"factor", 0}}),
                       "/rotary/scaling/factor: must be positive for yarn scaling, got 0");
  require_only_problem(yarn_with({{"original_max_position", -4096}}),
                       "/rotary/scaling/original_max_position: must be positive for yarn scaling, got -4096");
  require_only_problem(yarn_with({{"beta_fast", 1}, {"beta_slow", 1}}),
                       "/rotary/scaling/beta_fast: 1 must be greater than beta_slow 1");
  require_only_problem(yarn_with({{"beta_slow", 0}}),
                       "/rotary/scaling/beta_slow: must be positive for yarn scaling, got 0");
  require_only_problem(yarn_with({{"attention_factor", 0}}),
                       "/rotary/scaling/attention_factor: must be positive for yarn scaling, got 0");
}

TEST_CASE("attention_scale, softcap, sliding_window", "[config][rules]") {
  require_only_problem(document_with({{"attention_scale", 0}}), "/attention_scale: must be positive, got 0");
  require_only_problem(document_with({{"softcap", 0}}),
                       "/softcap: must be positive (omit it for no soft-capping), got 0");
  require_only_problem(document_with({{"softcap", -30}}), "/softcap: must be positive");
  require_only_problem(document_with({{"sliding_window", 0}}),
                       "/sliding_window: must be >= 1 (omit it for full causal attention), got 0");
  require_valid(document_with({{"sliding_window", 1}, {"softcap", 50}, {"attention_scale", 0.0625}}));
}

TEST_CASE("block-scaled formats need K to be a multiple of the block", "[config][rules][formats]") {
  // hidden 4112 = 32 * 128.5; head_dim set since 4112 / 32 heads is not whole.
  require_only_problem(
      document_with({{"hidden_size", 4112}, {"head_dim", 128}, {"projection", {{"format", "mxfp4"}}}}),
      "/projection/format: mxfp4 scales blocks of 32 weights along K, and hidden_size 4112 is not a "
      "multiple of 32");
  require_only_problem(
      document_with({{"hidden_size", 4112}, {"head_dim", 128}, {"projection", {{"format", "mxfp8"}}}}),
      "/projection/format: mxfp8 scales blocks of 32 weights along K, and hidden_size 4112");
  require_valid(
      document_with({{"hidden_size", 4112}, {"head_dim", 128}, {"projection", {{"format", "nvfp4"}}}}));
  require_only_problem(
      document_with({{"hidden_size", 4104}, {"head_dim", 128}, {"projection", {{"format", "nvfp4"}}}}),
      "/projection/format: nvfp4 scales blocks of 16 weights along K, and hidden_size 4104 is not a "
      "multiple of 16");

  // o_proj's K is query_heads * value_head_dim = 3 * 16 = 48.
  const json narrow = {{"hidden_size", 4096}, {"query_heads", 3}, {"head_dim", 16}};
  json own_output = narrow;
  own_output["projection"] = {{"output", {{"format", "mxfp8"}}}};
  require_only_problem(
      document_with(own_output),
      "/projection/output/format: mxfp8 scales blocks of 32 weights along K, and query_heads * "
      "value_head_dim = 48 is not a multiple of 32");
  json inherited = narrow;
  inherited["projection"] = {{"format", "mxfp4"}};
  const std::vector<std::string> problems = problems_of(document_with(inherited));
  CHECK(problems ==
        std::vector<std::string>{"/projection/output/format: mxfp4 scales blocks of 32 weights along K, "
                                 "and query_heads * value_head_dim = 48 is not a multiple of 32 (o_proj "
                                 "takes the qkv encoding unless /projection/output is set)"});
}

TEST_CASE("fp8 activations need sm_89 or newer when the arch is explicit", "[config][rules][formats]") {
  const json fp8 = {{"format", "fp8"}, {"activation", "fp8"}};
  require_only_problem(
      document_with({{"projection", fp8}, {"target", {{"arch", "sm_80"}}}}),
      "/projection/activation: fp8 activations need fp8 tensor cores (sm_89 or newer); target arch "
      "is sm_80");
  require_only_problem(document_with({{"projection", {{"output", fp8}}}, {"target", {{"arch", "sm_86"}}}}),
                       "/projection/output/activation: fp8 activations need fp8 tensor cores");
  require_valid(document_with({{"projection", fp8}, {"target", {{"arch", "sm_89"}}}}));
  require_valid(document_with({{"projection", fp8}, {"target", {{"arch", "sm_100a"}}}}));
  require_valid(document_with({{"projection", fp8}}));  // auto: decided when the arch is known
  require_valid(document_with({{"projection", {{"format", "fp8"}}}, {"target", {{"arch", "sm_80"}}}}));
}

TEST_CASE("packed_integer: bits, group_size, scheme, act_order", "[config][rules][formats]") {
  const auto packed = [](const json& fields) {
    json all = {{"format", "packed_integer"}};
    all.update(fields);
    return projection(all);
  };
  require_only_problem(packed({{"group_size", 48}}),
                       "/projection/group_size: 48 does not divide hidden_size 4096");
  require_only_problem(packed({{"group_size", 0}}),
                       "/projection/group_size: must be -1 (per channel) or positive, got 0");
  require_only_problem(packed({{"group_size", -2}}),
                       "/projection/group_size: must be -1 (per channel) or positive");
  require_only_problem(packed({{"bits", 3}}), "/projection/bits: 3 is not a packed_integer width (4 or 8)");
  require_only_problem(packed({{"scheme", "awq"}, {"bits", 8}}),
                       "/projection/bits: awq packs 4-bit values only, got 8");
  require_only_problem(packed({{"scheme", "awq"}, {"act_order", true}}),
                       "/projection/act_order: awq has no act order (g_idx); only gptq and gptq_v2 do");
  require_valid(packed({{"group_size", -1}, {"bits", 8}, {"act_order", true}}));
  require_valid(packed({{"scheme", "gptq_v2"}, {"group_size", 32}, {"act_order", true}}));
  require_valid(packed({{"scheme", "awq"}, {"group_size", 4096}}));

  // Own output encoding: K is query_heads * value_head_dim.
  require_only_problem(
      projection({{"output", {{"format", "packed_integer"}, {"group_size", 96}}}}),
      "/projection/output/group_size: 96 does not divide query_heads * value_head_dim = 4096");
  // Inherited: the K-independent rules are reported once, at /projection.
  CHECK(problems_of(packed({{"bits", 3}})).size() == 1);
  // ... and the K-dependent ones where K differs, saying where the encoding came from.
  const std::vector<std::string> problems =
      problems_of(document_with({{"hidden_size", 4608},
                                 {"query_heads", 32},
                                 {"head_dim", 128},
                                 {"projection", {{"format", "packed_integer"}, {"group_size", 192}}}}));
  CHECK(problems ==
        std::vector<std::string>{"/projection/output/group_size: 192 does not divide query_heads * "
                                 "value_head_dim = 4096 (o_proj takes the qkv encoding unless "
                                 "/projection/output is set)"});
}

TEST_CASE("affine: bits 2..8 without 7, group 32/64/128 dividing K", "[config][rules][formats]") {
  const auto affine = [](const json& fields) {
    json all = {{"format", "affine"}};
    all.update(fields);
    return projection(all);
  };
  for (const int bits : {2, 3, 4, 5, 6, 8}) require_valid(affine({{"bits", bits}}));
  require_only_problem(affine({{"bits", 7}}),
                       "/projection/bits: 7 is not an affine width (2, 3, 4, 5, 6 or 8)");
  require_only_problem(affine({{"bits", 1}}), "/projection/bits: 1 is not an affine width");
  require_only_problem(affine({{"group_size", 256}}),
                       "/projection/group_size: 256 is not an affine group size (32, 64 or 128)");
  for (const int group_size : {32, 64, 128}) require_valid(affine({{"group_size", group_size}}));
  // 4160 = 64 * 65: 64 divides it, 128 does not.
  require_valid(document_with({{"hidden_size", 4160},
                               {"head_dim", 128},
                               {"projection", {{"format", "affine"}, {"group_size", 64}}}}));
  require_only_problem(
      document_with({{"hidden_size", 4160}, {"head_dim", 128}, {"projection", {{"format", "affine"}}}}),
      "/projection/group_size: 128 does not divide hidden_size 4160");
}

TEST_CASE("kv_cache.block_size: a power of two in 1..1024", "[config][rules]") {
  for (const int bad : {0, -16, 24, 2048}) {
    require_only_problem(document_with({{"kv_cache", {{"block_size", bad}}}}),
                         fmt::format("/kv_cache/block_size: {} is not a power of two in 1..1024", bad));
  }
  for (const int good : {1, 16, 256, 1024}) {
    require_valid(document_with({{"kv_cache", {{"block_size", good}}}}));
  }
}

TEST_CASE("kv_cache.k_scale / v_scale: finite, positive, only with an fp8 cache", "[config][rules]") {
  const json fp8 = {{"dtype", "fp8_e4m3"}};
  for (const double bad : {0.0, -0.5}) {
    json kv_cache = fp8;
    kv_cache["k_scale"] = bad;
    require_only_problem(document_with({{"kv_cache", kv_cache}}),
                         fmt::format("/kv_cache/k_scale: {} must be finite and > 0", bad));
  }
  json kv_cache = fp8;
  kv_cache["v_scale"] = 0.0;
  require_only_problem(document_with({{"kv_cache", kv_cache}}),
                       "/kv_cache/v_scale: 0 must be finite and > 0");
  require_only_problem(document_with({{"kv_cache", {{"v_scale", 0.5}}}}),
                       "/kv_cache/v_scale: 0.5 is only meaningful with dtype fp8_e4m3 (dtype is bf16)");
  kv_cache = fp8;
  kv_cache["k_scale"] = 0.0421;
  kv_cache["v_scale"] = 2.5;
  const AttentionConfig config = parse(document_with({{"kv_cache", kv_cache}}), "test");
  CHECK(config.kv_cache.dtype == KvCacheDtype::fp8_e4m3);
  CHECK(config.kv_cache.k_scale == 0.0421);
  CHECK(config.kv_cache.v_scale == 2.5);
  CHECK(parse(to_json(config), "round trip") == config);
}

TEST_CASE("max_tokens in 1..2^20", "[config][rules]") {
  require_only_problem(document_with({{"max_tokens", 0}}), "/max_tokens: 0 is outside 1..1048576");
  require_only_problem(document_with({{"max_tokens", (1 << 20) + 1}}),
                       "/max_tokens: 1048577 is outside 1..1048576");
  require_valid(document_with({{"max_tokens", 1}}));
  require_valid(document_with({{"max_tokens", 1 << 20}}));
}

TEST_CASE("validate reports every problem of a config built in code", "[config][rules]") {
  AttentionConfig config;
  config.hidden_size = 4096;
  config.query_heads = 32;
  resolve_defaults(config);
  config.kv_heads = 5;
  config.rotary.pairing_dim = 6;
  config.kv_cache.block_size = 24;
  config.target.arch = Arch{7, 5, false};
  const std::vector<std::string> problems = validate(config);
  CHECK(problems ==
        std::vector<std::string>{
            "/kv_heads: 5 does not divide query_heads 32",
            "/rotary/pairing_dim: 6 does not divide rotary dim 128",
            "/kv_cache/block_size: 24 is not a power of two in 1..1024",
            "/target/arch: sm_75 is not supported: the kernels need sm_80 or newer (cp.async, bf16 mma)",
        });
}

}  // namespace
}  // namespace attnplan::config
