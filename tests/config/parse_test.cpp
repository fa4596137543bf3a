// Reading JSON: defaults, types, unknown keys, schema, syntax errors and how problems are reported.
#include <cmath>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "config/parse.hpp"
#include "config_testing.hpp"
#include "core/error.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace attnplan::config {
namespace {

using nlohmann::json;
using testing::document_with;
using testing::has_problem;
using testing::minimal_document;
using testing::problems_of;
using testing::require_only_problem;

// The Error parse_text throws for `text`.
Error parse_text_error(std::string_view text) {
  try {
    parse_text(text, "text.json");
  } catch (const Error& error) {
    return error;
  }
  FAIL("parse_text accepted: " << text);
  return Error(Stage::internal, "unreachable: FAIL throws");
}

TEST_CASE("every default of a minimal config", "[config][defaults]") {
  const AttentionConfig config = parse(minimal_document());
  CHECK(config.name.empty());
  CHECK(config.hidden_size == 4096);
  CHECK(config.query_heads == 32);
  CHECK(config.kv_heads == 32);
  CHECK(config.head_dim == 128);
  CHECK(config.value_head_dim == 128);
  CHECK(config.input_norm.epsilon == 1e-5);
  CHECK(config.input_norm.weight_offset == 0.0);
  CHECK_FALSE(config.qkv_bias);
  CHECK_FALSE(config.output_bias);
  CHECK_FALSE(config.qkv_norm.query);
  CHECK_FALSE(config.qkv_norm.key);
  CHECK_FALSE(config.qkv_norm.value);
  CHECK(config.qkv_norm.weight_offset == 0.0);
  CHECK(config.qkv_norm.epsilon == 1e-5);
  CHECK(config.rotary.offset == 0);
  CHECK(config.rotary.dim == 128);
  CHECK(config.rotary.pairing_dim == 128);
  CHECK(config.rotary.theta == 10000.0);
  CHECK(config.rotary.scaling.type == RopeScalingType::none);
  CHECK(config.attention_scale == 1.0 / std::sqrt(128.0));
  CHECK_FALSE(config.softcap);
  CHECK_FALSE(config.sliding_window);
  CHECK_FALSE(config.bidirectional_spans);
  CHECK_FALSE(config.sinks);
  CHECK(config.projection.qkv == WeightEncoding{});
  CHECK(config.projection.output == WeightEncoding{});
  CHECK(config.projection.qkv.format == WeightFormat::bf16);
  CHECK_FALSE(config.projection.fused_qkv);
  CHECK(config.kv_cache.block_size == 16);
  CHECK(config.kv_cache.dtype == KvCacheDtype::bf16);
  CHECK(config.max_tokens == 8192);
  CHECK_FALSE(config.target.arch);
}

TEST_CASE("defaults derived from other fields", "[config][defaults]") {
  SECTION("kv_heads, head_dim and value_head_dim follow the sizes") {
    const AttentionConfig config =
        parse(document_with({{"hidden_size", 2048}, {"query_heads", 8}, {"kv_heads", 2}}));
    CHECK(config.kv_heads == 2);
    CHECK(config.head_dim == 256);
    CHECK(config.value_head_dim == 256);
    CHECK(config.attention_scale == 1.0 / 16.0);
  }
  SECTION("value_head_dim follows an explicit head_dim") {
    const AttentionConfig config = parse(document_with({{"head_dim", 64}}));
    CHECK(config.value_head_dim == 64);
    CHECK(config.rotary.dim == 64);
  }
  SECTION("qkv_norm.epsilon follows input_norm.epsilon") {
    const AttentionConfig config = parse(document_with({{"input_norm", {{"epsilon", 1e-6}}}}));
    CHECK(config.qkv_norm.epsilon == 1e-6);
    CHECK(config.qkv_norm_epsilon() == 1e-6);
  }
  SECTION("rotary dim is what the offset leaves, pairing_dim the rotary dim") {
    const AttentionConfig config = parse(document_with({{"rotary", {{"offset", 32}}}}));
    CHECK(config.rotary.dim == 96);
    CHECK(config.rotary.pairing_dim == 96);
  }
  SECTION("pairing_dim follows an explicit rotary dim") {
    const AttentionConfig config = parse(document_with({{"rotary", {{"dim", 64}}}}));
    CHECK(config.pairing_dim() == 64);
  }
  SECTION("the output projection takes the qkv encoding unless it has its own") {
    const json fp8 = {{"format", "fp8"}, {"scale_granularity", "block"}};
    const AttentionConfig inherited = parse(document_with({{"projection", fp8}}));
    CHECK(inherited.projection.output == inherited.projection.qkv);
    CHECK(inherited.projection.output.scale_granularity == Fp8ScaleGranularity::block);

    const AttentionConfig own =
        parse(document_with({{"projection", {{"format", "fp8"}, {"output", json::object()}}}}));
    CHECK(own.projection.qkv.format == WeightFormat::fp8);
    CHECK(own.projection.output == WeightEncoding{});  // an "output" object starts from the bf16 defaults
  }
  SECTION("format parameters") {
    const WeightEncoding fp8 = parse(document_with({{"projection", {{"format", "fp8"}}}})).projection.qkv;
    CHECK(fp8.scale_granularity == Fp8ScaleGranularity::tensor);
    CHECK(fp8.activation == ActivationType::bf16);
    const WeightEncoding packed =
        parse(document_with({{"projection", {{"format", "packed_integer"}}}})).projection.qkv;
    CHECK(packed.scheme == PackedIntegerScheme::gptq);
    CHECK(packed.bits == 4);
    CHECK(packed.group_size == 128);
    CHECK_FALSE(packed.act_order);
    const WeightEncoding affine =
        parse(document_with({{"projection", {{"format", "affine"}}}})).projection.qkv;
    CHECK(affine.bits == 4);
    CHECK(affine.group_size == 128);
  }
  SECTION("llama3 scaling") {
    const RopeScaling scaling =
        parse(document_with(
                  {{"rotary",
                    {{"scaling", {{"type", "llama3"}, {"factor", 8}, {"original_max_position", 8192}}}}}}))
            .rotary.scaling;
    CHECK(scaling.low_freq_factor == 1.0);
    CHECK(scaling.high_freq_factor == 4.0);
  }
  SECTION("yarn scaling, with HF's attention_factor") {
    const json yarn = {{"type", "yarn"}, {"factor", 32}, {"original_max_position", 4096}};
    const RopeScaling scaling = parse(document_with({{"rotary", {{"scaling", yarn}}}})).rotary.scaling;
    CHECK(scaling.beta_fast == 32.0);
    CHECK(scaling.beta_slow == 1.0);
    CHECK(scaling.truncate);
    REQUIRE(scaling.attention_factor);
    CHECK(*scaling.attention_factor == Approx(1.34657359027997));  // 0.1 ln 32 + 1

    json unstretched = yarn;
    unstretched["factor"] = 0.5;  // HF get_mscale: no correction for factor <= 1
    CHECK(parse(document_with({{"rotary", {{"scaling", unstretched}}}})).rotary.scaling.attention_factor ==
          1.0);
  }
  SECTION("null means absent where absence has a meaning") {
    const json nulls = {{"kv_heads", nullptr},
                        {"head_dim", nullptr},
                        {"value_head_dim", nullptr},
                        {"attention_scale", nullptr},
                        {"softcap", nullptr},
                        {"sliding_window", nullptr},
                        {"qkv_norm", {{"epsilon", nullptr}}},
                        {"rotary", {{"dim", nullptr}, {"pairing_dim", nullptr}}}};
    json document = minimal_document();
    document.update(nulls);  // update, not merge_patch: merge_patch would drop the nulls
    CHECK(parse(document) == parse(minimal_document()));
  }
}

TEST_CASE("resolve_defaults completes a config built in code", "[config][defaults]") {
  AttentionConfig config;
  config.hidden_size = 4096;
  config.query_heads = 32;
  CHECK(has_problem(validate(config), "/kv_heads: must be positive, got 0"));
  resolve_defaults(config);
  CHECK(validate(config).empty());
  CHECK(config == parse(minimal_document()));
  CHECK_NOTHROW(check(config));

  config.kv_heads = 5;
  try {
    check(config, "built in code");
    FAIL("check accepted kv_heads 5");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::config);
    CHECK(error.message() == "1 problem in built in code");
    CHECK(error.details() == std::vector<std::string>{"/kv_heads: 5 does not divide query_heads 32"});
  }
}

TEST_CASE("the schema is required and checked", "[config][schema]") {
  require_only_problem(document_with({{"schema", nullptr}}), "/schema: required: \"attnplan/v1\"");
  require_only_problem(document_with({{"schema", "attnplan/v2"}}),
                       "/schema: \"attnplan/v2\" is not supported (expected \"attnplan/v1\")");
  require_only_problem(document_with({{"schema", 1}}), "/schema: expected a string, got number 1");
}

TEST_CASE("hidden_size and query_heads are required", "[config][schema]") {
  // Nothing else is reported: every other size derives from these two.
  require_only_problem(document_with({{"hidden_size", nullptr}}), "/hidden_size: required");
  require_only_problem(document_with({{"query_heads", nullptr}}), "/query_heads: required");
  require_only_problem(document_with({{"query_heads", 0}}), "/query_heads: must be positive, got 0");
  require_only_problem(document_with({{"hidden_size", -8}}), "/hidden_size: must be positive, got -8");
  require_only_problem(document_with({{"hidden_size", "4096"}}), "/hidden_size: expected an integer");
}

TEST_CASE("explicit sizes must be positive: 0 is not 'default'", "[config][schema]") {
  require_only_problem(document_with({{"kv_heads", 0}}), "/kv_heads: must be positive, got 0 (omit it");
  require_only_problem(document_with({{"head_dim", -64}}), "/head_dim: must be positive, got -64");
  require_only_problem(document_with({{"value_head_dim", 0}}), "/value_head_dim: must be positive, got 0");
}

TEST_CASE("wrong JSON types name the expected type", "[config][types]") {
  require_only_problem(document_with({{"hidden_size", 4096.5}}),
                       "/hidden_size: expected an integer, got number 4096.5");
  require_only_problem(document_with({{"max_tokens", "8192"}}),
                       "/max_tokens: expected an integer, got string \"8192\"");
  require_only_problem(document_with({{"max_tokens", 5000000000LL}}),
                       "/max_tokens: 5000000000 is out of range");
  require_only_problem(document_with({{"max_tokens", -5000000000LL}}),
                       "/max_tokens: -5000000000 is out of range");
  require_only_problem(document_with({{"rotary", {{"theta", "1e4"}}}}),
                       "/rotary/theta: expected a number, got string \"1e4\"");
  require_only_problem(document_with({{"qkv_bias", 1}}), "/qkv_bias: expected a boolean, got number 1");
  require_only_problem(document_with({{"name", 7}}), "/name: expected a string, got number 7");
  require_only_problem(document_with({{"rotary", json::array()}}), "/rotary: expected an object, got array");
  require_only_problem(document_with({{"input_norm", 1e-5}}), "/input_norm: expected an object, got number");
  require_only_problem(
      document_with({{"projection", {{"format", 3}}}}),
      "/projection/format: expected one of bf16, fp8, mxfp8, mxfp4, nvfp4, packed_integer, affine, "
      "got number 3");
  require_only_problem(
      document_with({{"projection", {{"format", "fp16"}}}}),
      "/projection/format: \"fp16\" is not one of bf16, fp8, mxfp8, mxfp4, nvfp4, packed_integer, "
      "affine");
  require_only_problem(document_with({{"kv_cache", {{"dtype", "fp8"}}}}),
                       "/kv_cache/dtype: \"fp8\" is not one of bf16, fp8_e4m3");
  require_only_problem(document_with({{"rotary", {{"scaling", {{"type", "dynamic"}}}}}}),
                       "/rotary/scaling/type: \"dynamic\" is not one of none, linear, llama3, yarn");
  require_only_problem(
      document_with(
          {{"rotary", {{"scaling", {{"type", "yarn"}, {"factor", 4}, {"original_max_position", 1.5}}}}}}),
      "/rotary/scaling/original_max_position: expected an integer, got number 1.5");
  require_only_problem(document_with({{"projection", {{"format", "packed_integer"}, {"act_order", "yes"}}}}),
                       "/projection/act_order: expected a boolean, got string \"yes\"");
  require_only_problem(document_with({{"target", {{"arch", 90}}}}),
                       "/target/arch: expected a string, got number 90");

  // null is "absent" only where absence means something; a bool has a plain default instead.
  json document = minimal_document();
  document["sinks"] = nullptr;
  require_only_problem(document, "/sinks: expected a boolean, got null");

  require_only_problem(json::array(), "/: expected an object, got array");
}

TEST_CASE("unknown keys are errors at every level, listing the known ones", "[config][keys]") {
  require_only_problem(
      document_with({{"hidden", 1}}),
      "/hidden: unknown key (known: schema, name, hidden_size, query_heads, kv_heads, head_dim, "
      "value_head_dim, input_norm, qkv_bias, output_bias, qkv_norm, rotary, attention_scale, "
      "softcap, sliding_window, bidirectional_spans, sinks, projection, kv_cache, max_tokens, target)");
  require_only_problem(document_with({{"input_norm", {{"eps", 1e-6}}}}),
                       "/input_norm/eps: unknown key (known: epsilon, weight_offset)");
  require_only_problem(document_with({{"qkv_norm", {{"q", true}}}}),
                       "/qkv_norm/q: unknown key (known: query, key, value, weight_offset, epsilon)");
  require_only_problem(document_with({{"rotary", {{"base", 1e4}}}}),
                       "/rotary/base: unknown key (known: offset, dim, pairing_dim, theta, scaling)");
  require_only_problem(
      document_with({{"rotary", {{"scaling", {{"type", "linear"}, {"factor", 2}, {"typo_key", 1}}}}}}),
      "/rotary/scaling/typo_key: unknown key (known: type, factor, low_freq_factor, high_freq_factor, "
      "original_max_position, beta_fast, beta_slow, truncate, attention_factor)");
  require_only_problem(
      document_with({{"projection", {{"fomat", "bf16"}}}}),
      "/projection/fomat: unknown key (known: format, scale_granularity, activation, scheme, bits, "
      "group_size, act_order, fused_qkv, output)");
  require_only_problem(
      document_with({{"projection", {{"output", {{"fused_qkv", true}}}}}}),
      "/projection/output/fused_qkv: unknown key (known: format, scale_granularity, activation, "
      "scheme, bits, group_size, act_order)");
  require_only_problem(document_with({{"kv_cache", {{"page_size", 16}}}}),
                       "/kv_cache/page_size: unknown key (known: block_size, dtype, k_scale, v_scale)");
  require_only_problem(document_with({{"target", {{"sm", "sm_90"}}}}),
                       "/target/sm: unknown key (known: arch)");
  // JSON Pointer escaping keeps odd keys unambiguous.
  require_only_problem(document_with({{"a/b~c", 1}}), "/a~1b~0c: unknown key");
}

TEST_CASE("parameters of another format or scaling type are refused", "[config][keys]") {
  require_only_problem(document_with({{"projection", {{"format", "fp8"}, {"bits", 4}}}}),
                       "/projection/bits: not a parameter of format fp8");
  require_only_problem(document_with({{"projection", {{"group_size", 64}}}}),
                       "/projection/group_size: not a parameter of format bf16");
  require_only_problem(document_with({{"projection", {{"format", "affine"}, {"scheme", "awq"}}}}),
                       "/projection/scheme: not a parameter of format affine");
  require_only_problem(document_with({{"projection", {{"format", "nvfp4"}, {"activation", "fp8"}}}}),
                       "/projection/activation: not a parameter of format nvfp4");
  require_only_problem(
      document_with({{"projection", {{"output", {{"format", "mxfp4"}, {"scale_granularity", "block"}}}}}}),
      "/projection/output/scale_granularity: not a parameter of format mxfp4");
  // A refused parameter is reported once, whatever its value.
  require_only_problem(document_with({{"projection", {{"format", "fp8"}, {"bits", "many"}}}}),
                       "/projection/bits: not a parameter of format fp8");
  // An unknown format says so, and no parameter is judged against it.
  require_only_problem(document_with({{"projection", {{"format", "int4"}, {"bits", 4}}}}),
                       "/projection/format: \"int4\" is not one of");

  require_only_problem(document_with({{"rotary", {{"scaling", {{"factor", 2}}}}}}),
                       "/rotary/scaling/factor: not a parameter of scaling type none");
  require_only_problem(
      document_with(
          {{"rotary",
            {{"scaling",
              {{"type", "llama3"}, {"factor", 8}, {"original_max_position", 8192}, {"beta_fast", 32}}}}}}),
      "/rotary/scaling/beta_fast: not a parameter of scaling type llama3");
  require_only_problem(
      document_with({{"rotary", {{"scaling", {{"type", "linear"}, {"factor", 2}, {"truncate", false}}}}}}),
      "/rotary/scaling/truncate: not a parameter of scaling type linear");
}

TEST_CASE("scaling types require their factor and original context", "[config][keys]") {
  require_only_problem(document_with({{"rotary", {{"scaling", {{"type", "linear"}}}}}}),
                       "/rotary/scaling/factor: required for scaling type linear");
  require_only_problem(document_with({{"rotary", {{"scaling", {{"type", "llama3"}, {"factor", 8}}}}}}),
                       "/rotary/scaling/original_max_position: required for scaling type llama3");
  const std::vector<std::string> problems =
      problems_of(document_with({{"rotary", {{"scaling", {{"type", "yarn"}}}}}}));
  CHECK(problems ==
        std::vector<std::string>{"/rotary/scaling/factor: required for scaling type yarn",
                                 "/rotary/scaling/original_max_position: required for scaling type yarn"});
}

TEST_CASE("all problems are reported together in one error", "[config][report]") {
  const json document = document_with(
      {{"kv_heads", 5},
       {"rotary", {{"pairing_dim", 6}, {"scaling", {{"type", "linear"}, {"factor", 2}, {"typo_key", 1}}}}},
       {"sinks", "yes"}});
  try {
    parse(document, "plans/x.json");
    FAIL("parse accepted a broken config");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::config);
    CHECK(error.is_user_error());
    CHECK(error.message() == "4 problems in plans/x.json");
    CHECK(std::string(error.what()) == "config error: 4 problems in plans/x.json");
    const std::vector<std::string>& details = error.details();
    REQUIRE(details.size() == 4);
    CHECK(has_problem(details, "/kv_heads: 5 does not divide query_heads 32"));
    CHECK(has_problem(details, "/rotary/pairing_dim: 6 does not divide rotary dim 128"));
    CHECK(has_problem(details, "/rotary/scaling/typo_key: unknown key (known: type, factor,"));
    CHECK(has_problem(details, "/sinks: expected a boolean, got string \"yes\""));
  }
}

TEST_CASE("JSON syntax errors give line and column", "[config][syntax]") {
  SECTION("a missing comma") {
    // nlohmann reports the last character of the token it could not take: the closing quote here.
    const Error error = parse_text_error("{\n  \"schema\": \"attnplan/v1\"\n  \"hidden_size\": 4096\n}\n");
    CHECK(error.stage() == Stage::config);
    CHECK(error.message() == "invalid JSON in text.json at line 3, column 15");
    REQUIRE(error.details().size() == 1);
    CHECK(error.details().front().starts_with("line 3, column 15: syntax error"));
    CHECK(error.payload() == "  \"hidden_size\": 4096\n              ^");
  }
  SECTION("the end of the text") {
    const Error error = parse_text_error("{\"schema\": \"attnplan/v1\",\n\"hidden_size\": ");
    CHECK(error.message().starts_with("invalid JSON in text.json at line 2"));
    CHECK(error.details().front().find("unexpected end of input") != std::string::npos);
  }
  SECTION("nothing at all") {
    CHECK(parse_text_error("").message() == "invalid JSON in text.json at line 1, column 1");
  }
}

TEST_CASE("duplicate keys are reported with their path", "[config][syntax]") {
  const std::string text = R"({
    "schema": "attnplan/v1", "hidden_size": 4096, "query_heads": 32,
    "rotary": {"theta": 10000, "theta": 500000},
    "sliding_window": 128, "sliding_window": 256
  })";
  const Error error = parse_text_error(text);
  CHECK(error.message() == "2 problems in text.json");
  CHECK(error.details() ==
        std::vector<std::string>{"/rotary/theta: duplicate key (JSON keeps only the last)",
                                 "/sliding_window: duplicate key (JSON keeps only the last)"});
  // Inside arrays (which no field takes) the path counts the elements.
  CHECK(has_problem(parse_text_error(R"({"a": [1, {"x": 1}, {"x": 1, "x": 2}]})").details(),
                    "/a/2/x: duplicate key"));
  // Equal keys in different objects are not duplicates.
  CHECK_NOTHROW(parse_text(R"({"schema": "attnplan/v1", "hidden_size": 4096, "query_heads": 32,
                              "input_norm": {"epsilon": 1e-6}, "qkv_norm": {"epsilon": 1e-6}})",
                           "text.json"));
}

TEST_CASE("load_file names the file", "[config][file]") {
  const attnplan::testing::TempDir dir("attnplan-config-test");
  const auto path = dir / "broken.json";
  std::ofstream(path) << document_with({{"kv_heads", 3}}).dump(2);
  try {
    load_file(path);
    FAIL("load_file accepted kv_heads 3");
  } catch (const Error& error) {
    CHECK(error.message() == fmt::format("1 problem in {}", path.string()));
    CHECK(error.details() == std::vector<std::string>{"/kv_heads: 3 does not divide query_heads 32"});
  }

  const auto good = dir / "good.json";
  std::ofstream(good) << minimal_document().dump();
  CHECK(load_file(good) == parse(minimal_document()));

  try {
    load_file(dir / "missing.json");
    FAIL("load_file read a missing file");
  } catch (const Error& error) {
    CHECK(error.is_user_error());
    CHECK(error.message().find("missing.json") != std::string::npos);
  }
}

TEST_CASE("target.arch: auto or an architecture", "[config][arch]") {
  CHECK_FALSE(parse(document_with({{"target", {{"arch", "auto"}}}})).target.arch);
  CHECK(parse(document_with({{"target", {{"arch", "sm_90a"}}}})).target.arch == Arch{9, 0, true});
  CHECK(parse(document_with({{"target", {{"arch", "sm_86"}}}})).target.arch == Arch{8, 6, false});
  require_only_problem(
      document_with({{"target", {{"arch", "sm90"}}}}),
      "/target/arch: \"sm90\" is not an architecture (expected \"auto\" or sm_<major><minor>[a]");
  require_only_problem(document_with({{"target", {{"arch", "sm_75"}}}}),
                       "/target/arch: sm_75 is not supported: the kernels need sm_80 or newer");
  require_only_problem(
      document_with({{"target", {{"arch", "sm_80a"}}}}),
      "/target/arch: sm_80a does not exist: architecture-specific (\"a\") variants start at sm_90a");
}

TEST_CASE("parse_arch and Arch::name", "[config][arch]") {
  struct Case {
    std::string_view text;
    Arch arch;
  };
  for (const Case& known :
       {Case{"sm_80", {8, 0, false}}, Case{"sm_86", {8, 6, false}}, Case{"sm_87", {8, 7, false}},
        Case{"sm_89", {8, 9, false}}, Case{"sm_90", {9, 0, false}}, Case{"sm_90a", {9, 0, true}},
        Case{"sm_100a", {10, 0, true}}, Case{"sm_103a", {10, 3, true}}, Case{"sm_120", {12, 0, false}},
        Case{"sm_121a", {12, 1, true}}, Case{"sm_75", {7, 5, false}}}) {
    CAPTURE(known.text);
    const std::optional<Arch> parsed = parse_arch(known.text);
    REQUIRE(parsed);
    CHECK(*parsed == known.arch);
    CHECK(parsed->name() == known.text);
  }
  CHECK(parse_arch("sm_90a")->sm() == 90);
  CHECK(parse_arch("sm_120")->sm() == 120);
  CHECK(kDefaultArch.name() == "sm_90a");
  for (const std::string_view bad : {"", "sm_", "sm_9", "sm90", "sm_1000", "sm_90b", "sm_90aa", "sm_a",
                                     "sm_09", "SM_90", "compute_90", "sm_9x", " sm_90", "sm_90 ", "auto"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_arch(bad));
  }
}

TEST_CASE("arch_problem: the one rule for every arch a plan may be built for", "[config][arch]") {
  for (const std::string_view fine : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120"}) {
    CAPTURE(fine);
    CHECK_FALSE(arch_problem(*parse_arch(fine)));
  }
  CHECK(arch_problem(*parse_arch("sm_75")) ==
        "sm_75 is not supported: the kernels need sm_80 or newer (cp.async, bf16 mma)");
  CHECK(arch_problem(*parse_arch("sm_70")) ==
        "sm_70 is not supported: the kernels need sm_80 or newer (cp.async, bf16 mma)");
  CHECK(arch_problem(*parse_arch("sm_80a")) ==
        "sm_80a does not exist: architecture-specific (\"a\") variants start at sm_90a");
  CHECK(arch_problem(*parse_arch("sm_89a")).has_value());
}

TEST_CASE("to_string of every enum matches its JSON spelling", "[config][enums]") {
  CHECK(to_string(RopeScalingType::none) == "none");
  CHECK(to_string(RopeScalingType::linear) == "linear");
  CHECK(to_string(RopeScalingType::llama3) == "llama3");
  CHECK(to_string(RopeScalingType::yarn) == "yarn");
  CHECK(to_string(WeightFormat::bf16) == "bf16");
  CHECK(to_string(WeightFormat::fp8) == "fp8");
  CHECK(to_string(WeightFormat::mxfp8) == "mxfp8");
  CHECK(to_string(WeightFormat::mxfp4) == "mxfp4");
  CHECK(to_string(WeightFormat::nvfp4) == "nvfp4");
  CHECK(to_string(WeightFormat::packed_integer) == "packed_integer");
  CHECK(to_string(WeightFormat::affine) == "affine");
  CHECK(to_string(Fp8ScaleGranularity::tensor) == "tensor");
  CHECK(to_string(Fp8ScaleGranularity::channel) == "channel");
  CHECK(to_string(Fp8ScaleGranularity::block) == "block");
  CHECK(to_string(ActivationType::bf16) == "bf16");
  CHECK(to_string(ActivationType::fp8) == "fp8");
  CHECK(to_string(PackedIntegerScheme::gptq) == "gptq");
  CHECK(to_string(PackedIntegerScheme::gptq_v2) == "gptq_v2");
  CHECK(to_string(PackedIntegerScheme::awq) == "awq");
  CHECK(to_string(KvCacheDtype::bf16) == "bf16");
  CHECK(to_string(KvCacheDtype::fp8_e4m3) == "fp8_e4m3");
}

TEST_CASE("to_json writes every field with its resolved default", "[config][to_json]") {
  const json canonical = to_json(parse(minimal_document()));
  CHECK(canonical["schema"] == "attnplan/v1");
  CHECK(canonical["kv_heads"] == 32);
  CHECK(canonical["head_dim"] == 128);
  CHECK(canonical["value_head_dim"] == 128);
  CHECK(canonical["input_norm"] == json{{"epsilon", 1e-5}, {"weight_offset", 0}});
  CHECK(canonical["qkv_norm"] ==
        json{{"query", false}, {"key", false}, {"value", false}, {"weight_offset", 0}, {"epsilon", 1e-5}});
  CHECK(canonical["rotary"] == json{{"offset", 0},
                                    {"dim", 128},
                                    {"pairing_dim", 128},
                                    {"theta", 10000},
                                    {"scaling", {{"type", "none"}}}});
  CHECK(canonical["attention_scale"] == 1.0 / std::sqrt(128.0));
  CHECK(canonical["softcap"].is_null());
  CHECK(canonical["sliding_window"].is_null());
  CHECK(canonical["projection"] ==
        json{{"format", "bf16"}, {"fused_qkv", false}, {"output", {{"format", "bf16"}}}});
  CHECK(canonical["kv_cache"] == json{{"block_size", 16}, {"dtype", "bf16"}});
  CHECK(canonical["max_tokens"] == 8192);
  CHECK(canonical["target"] == json{{"arch", "auto"}});
  CHECK(canonical.size() == 21);  // every root key
  // A config built in code is resolved on the way out.
  AttentionConfig built;
  built.hidden_size = 4096;
  built.query_heads = 32;
  CHECK(to_json(built) == canonical);
}

TEST_CASE("to_json round-trips every format, scaling type and option", "[config][to_json]") {
  const json variants[] = {
      {{"projection", {{"format", "fp8"}, {"scale_granularity", "channel"}, {"activation", "fp8"}}},
       {"target", {{"arch", "sm_90a"}}}},
      {{"projection", {{"format", "mxfp8"}}}},
      {{"projection", {{"format", "mxfp4"}, {"output", {{"format", "bf16"}}}}}},
      {{"projection", {{"format", "nvfp4"}, {"fused_qkv", true}}}},
      {{"projection",
        {{"format", "packed_integer"},
         {"scheme", "gptq_v2"},
         {"bits", 8},
         {"group_size", -1},
         {"act_order", true}}}},
      {{"projection", {{"format", "packed_integer"}, {"scheme", "awq"}, {"group_size", 64}}}},
      {{"projection",
        {{"format", "affine"},
         {"bits", 3},
         {"group_size", 32},
         {"output", {{"format", "fp8"}, {"scale_granularity", "block"}}}}}},
      {{"rotary", {{"scaling", {{"type", "linear"}, {"factor", 8}}}}}},
      {{"rotary",
        {{"theta", 5e5},
         {"scaling",
          {{"type", "llama3"},
           {"factor", 8},
           {"low_freq_factor", 1},
           {"high_freq_factor", 4},
           {"original_max_position", 8192}}}}}},
      {{"rotary",
        {{"scaling",
          {{"type", "yarn"},
           {"factor", 40},
           {"original_max_position", 4096},
           {"truncate", false},
           {"beta_fast", 16},
           {"beta_slow", 2}}}}}},
      {{"rotary", {{"dim", 0}}}},
      {{"head_dim", 192},
       {"value_head_dim", 128},
       {"rotary", {{"offset", 128}, {"dim", 64}, {"pairing_dim", 2}}}},
      {{"softcap", 50.0},
       {"sliding_window", 4096},
       {"attention_scale", 0.1},
       {"sinks", true},
       {"bidirectional_spans", true}},
      {{"qkv_norm",
        {{"query", true}, {"key", true}, {"value", true}, {"weight_offset", 1}, {"epsilon", 1e-6}}},
       {"input_norm", {{"epsilon", 1e-6}, {"weight_offset", 1}}},
       {"qkv_bias", true},
       {"output_bias", true}},
      {{"kv_cache", {{"block_size", 256}, {"dtype", "fp8_e4m3"}}}, {"max_tokens", 1 << 20}, {"name", "x"}},
  };
  for (const json& patch : variants) {
    CAPTURE(patch.dump());
    const AttentionConfig config = parse(document_with(patch));
    const json canonical = to_json(config);
    CHECK(parse(canonical) == config);
    CHECK(parse_text(canonical.dump(2), "canonical") == config);
    CHECK(to_json(parse(canonical)) == canonical);
  }
}

}  // namespace
}  // namespace attnplan::config
