// A checkpoint's fp8 KV cache scales (io/kv_cache_scales.hpp): every name the quantizers write, the legacy
// kv_scale for both, the dtypes and shapes accepted, agreement with the config and between names, and an
// error naming what is wrong for each way a scale can be wrong or missing. Files are written by the test.
#include "io/kv_cache_scales.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/parse.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

using attnplan::Error;
using attnplan::Stage;
using attnplan::config::AttentionConfig;
using attnplan::io::Dtype;
using attnplan::io::is_kv_scale_name;
using attnplan::io::KvCacheScales;
using attnplan::io::read_kv_cache_scales;
using attnplan::io::SafetensorsFile;
using attnplan::io::SafetensorsWriter;
using attnplan::testing::TempDir;

namespace {

const std::string kPrefix = "model.layers.3.";

AttentionConfig fp8_config(const nlohmann::json& kv_cache_patch = nlohmann::json::object()) {
  nlohmann::json kv_cache = {{"dtype", "fp8_e4m3"}};
  kv_cache.merge_patch(kv_cache_patch);
  const nlohmann::json document = {{"schema", "attnplan/v1"}, {"hidden_size", 64}, {"query_heads", 4},
                                   {"kv_heads", 2},           {"head_dim", 16},    {"kv_cache", kv_cache}};
  return attnplan::config::parse(document, "test");
}

std::vector<std::uint8_t> f32_bytes(float value) {
  std::vector<std::uint8_t> bytes(4);
  std::memcpy(bytes.data(), &value, 4);
  return bytes;
}

// One scalar tensor to write: name under kPrefix, dtype, shape, value.
struct Scalar {
  std::string relative;
  float value = 1.0f;
  Dtype dtype = Dtype::f32;
  std::vector<std::int64_t> shape = {};
};

std::vector<std::uint8_t> encoded(const Scalar& scalar, std::size_t count) {
  std::vector<std::uint8_t> bytes;
  for (std::size_t i = 0; i < count; ++i) {
    if (scalar.dtype == Dtype::f32) {
      const auto one = f32_bytes(scalar.value);
      bytes.insert(bytes.end(), one.begin(), one.end());
    } else if (scalar.dtype == Dtype::bf16) {
      const std::uint16_t bits = attnplan::core::float_to_bf16(scalar.value);
      bytes.push_back(static_cast<std::uint8_t>(bits));
      bytes.push_back(static_cast<std::uint8_t>(bits >> 8));
    } else if (scalar.dtype == Dtype::f16) {
      // Exactly representable test values only: 0.5 = 0x3800, 0.25 = 0x3400.
      const std::uint16_t bits = scalar.value == 0.5f ? 0x3800 : 0x3400;
      bytes.push_back(static_cast<std::uint8_t>(bits));
      bytes.push_back(static_cast<std::uint8_t>(bits >> 8));
    } else {
      bytes.resize(bytes.size() + attnplan::io::element_size(scalar.dtype), 1);
    }
  }
  return bytes;
}

// A file of the given scalars (plus one unrelated tensor, as a real checkpoint has many).
SafetensorsFile file_with(const TempDir& dir, const std::vector<Scalar>& scalars) {
  SafetensorsWriter writer;
  writer.add(kPrefix + "mlp.down_proj.weight_scale", Dtype::f32, {}, f32_bytes(7.0f));
  for (const auto& scalar : scalars) {
    std::size_t count = 1;
    for (const auto extent : scalar.shape) count *= static_cast<std::size_t>(extent);
    writer.add(kPrefix + scalar.relative, scalar.dtype, scalar.shape, encoded(scalar, count));
  }
  writer.write(dir / "scales.safetensors");
  return SafetensorsFile::open(dir / "scales.safetensors");
}

Error scales_error(const SafetensorsFile& file, const AttentionConfig& config) {
  Error error = expect_error([&] { read_kv_cache_scales(file, config, kPrefix); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), file.path().string()));
  return error;
}

}  // namespace

TEST_CASE("every quantizer's k / v scale names are read", "[io][kv_scales]") {
  const TempDir dir;
  struct Case {
    std::string k, v;
  };
  const Case named =
      GENERATE(Case{"self_attn.k_scale", "self_attn.v_scale"},                           // llm-compressor
               Case{"self_attn.attn.k_scale", "self_attn.attn.v_scale"},                 // vLLM
               Case{"self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"},             // ModelOpt
               Case{"self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale"});  // Quark
  CAPTURE(named.k, named.v);
  const auto file = file_with(dir, {{named.k, 0.0421f}, {named.v, 0.0173f, Dtype::f32, {1}}});
  const auto scales = read_kv_cache_scales(file, fp8_config(), kPrefix);
  REQUIRE(scales);
  CHECK(*scales == KvCacheScales{0.0421f, 0.0173f, kPrefix + named.k, kPrefix + named.v});
}

TEST_CASE("the legacy single kv_scale serves k and v", "[io][kv_scales]") {
  const TempDir dir;
  const auto file = file_with(dir, {{"self_attn.kv_scale", 0.03125f, Dtype::bf16}});
  const auto scales = read_kv_cache_scales(file, fp8_config(), kPrefix);
  REQUIRE(scales);
  CHECK(scales->k_scale == 0.03125f);
  CHECK(scales->v_scale == 0.03125f);
  CHECK(scales->k_source == kPrefix + "self_attn.kv_scale");
}

TEST_CASE("BF16 and F16 scales widen exactly", "[io][kv_scales]") {
  const TempDir dir;
  const auto file = file_with(
      dir, {{"self_attn.k_scale", 0.5f, Dtype::f16}, {"self_attn.v_scale", 0.25f, Dtype::bf16, {1}}});
  const auto scales = read_kv_cache_scales(file, fp8_config(), kPrefix);
  REQUIRE(scales);
  CHECK(scales->k_scale == 0.5f);
  CHECK(scales->v_scale == 0.25f);
}

TEST_CASE("a config scale must agree with the checkpoint's, compared as f32", "[io][kv_scales]") {
  const TempDir dir;
  const auto file = file_with(dir, {{"self_attn.k_scale", 0.02f}, {"self_attn.v_scale", 0.05f}});
  // 0.02 is not a float: the config's double rounds to the checkpoint's f32.
  const auto agreeing =
      read_kv_cache_scales(file, fp8_config({{"k_scale", 0.02}, {"v_scale", 0.05}}), kPrefix);
  REQUIRE(agreeing);
  CHECK(agreeing->k_source == kPrefix + "self_attn.k_scale");

  const Error error = scales_error(file, fp8_config({{"k_scale", 0.5}}));
  REQUIRE(error.details().size() == 1);
  CHECK(contains(error.details()[0], "/kv_cache/k_scale: 0.5 in the config disagrees with " + kPrefix +
                                         "self_attn.k_scale = 0.02 in the checkpoint"));
}

TEST_CASE("without a checkpoint scale the config's is used, naming the field", "[io][kv_scales]") {
  const TempDir dir;
  const auto file = file_with(dir, {{"self_attn.k_scale", 0.125f}});
  const auto scales = read_kv_cache_scales(file, fp8_config({{"v_scale", 0.75}}), kPrefix);
  REQUIRE(scales);
  CHECK(*scales == KvCacheScales{0.125f, 0.75f, kPrefix + "self_attn.k_scale", "/kv_cache/v_scale"});
}

TEST_CASE("a missing scale with no config value names every tensor tried", "[io][kv_scales]") {
  const TempDir dir;
  const auto file = file_with(dir, {{"self_attn.v_scale", 0.25f}});
  const Error error = scales_error(file, fp8_config());
  REQUIRE(error.details().size() == 1);
  const std::string& detail = error.details()[0];
  CHECK(contains(detail, "no k cache scale: kv_cache.dtype is fp8_e4m3, /kv_cache/k_scale is not set"));
  for (const auto& name : attnplan::io::kv_scale_names('k')) CHECK(contains(detail, kPrefix + name));
}

TEST_CASE("non-positive, non-finite, non-scalar and non-float scales are errors", "[io][kv_scales]") {
  const TempDir dir;
  struct Case {
    Scalar k;
    std::string expected;
  };
  const Case bad = GENERATE(
      Case{{"self_attn.k_scale", 0.0f}, "self_attn.k_scale: 0 is not finite and > 0"},
      Case{{"self_attn.k_scale", -0.5f}, "self_attn.k_scale: -0.5 is not finite and > 0"},
      Case{{"self_attn.k_scale", std::numeric_limits<float>::infinity()},
           "self_attn.k_scale: inf is not finite"},
      Case{{"self_attn.k_scale", std::numeric_limits<float>::quiet_NaN()},
           "self_attn.k_scale: nan is not finite"},
      Case{{"self_attn.k_scale", 0.5f, Dtype::f32, {2}}, "self_attn.k_scale: shape [2], expected [] or [1]"},
      Case{{"self_attn.k_proj.k_scale", 0.5f, Dtype::u8},
           "self_attn.k_proj.k_scale: dtype U8, expected F32"});
  CAPTURE(bad.expected);
  const auto file = file_with(dir, {bad.k, {"self_attn.v_scale", 0.25f}});
  // A given config value does not hide a broken checkpoint tensor.
  const Error error = scales_error(file, fp8_config({{"k_scale", 0.5}}));
  REQUIRE(error.details().size() == 1);
  CHECK(contains(error.details()[0], kPrefix + bad.expected));
}

TEST_CASE("two names of one scale must agree", "[io][kv_scales]") {
  const TempDir dir;
  const auto file = file_with(
      dir, {{"self_attn.k_scale", 0.25f}, {"self_attn.kv_scale", 0.5f}, {"self_attn.v_scale", 0.5f}});
  const Error error = scales_error(file, fp8_config());
  REQUIRE(error.details().size() == 1);
  CHECK(contains(error.details()[0],
                 kPrefix + "self_attn.k_scale = 0.25 and " + kPrefix + "self_attn.kv_scale = 0.5 disagree"));
}

TEST_CASE("a bf16 cache reads no scales", "[io][kv_scales]") {
  const TempDir dir;
  const auto file = file_with(dir, {{"self_attn.k_scale", -1.0f}});
  AttentionConfig config = fp8_config();
  config.kv_cache.dtype = attnplan::config::KvCacheDtype::bf16;
  CHECK_FALSE(read_kv_cache_scales(file, config, kPrefix).has_value());
}

TEST_CASE("scale names are recognised relative to the layer prefix", "[io][kv_scales]") {
  for (const char* name : {"self_attn.k_scale", "self_attn.attn.v_scale", "self_attn.k_proj.k_scale",
                           "self_attn.v_proj.output_scale", "self_attn.kv_scale", "self_attn.q_scale",
                           "self_attn.prob_output_scale"}) {
    CAPTURE(name);
    CHECK(is_kv_scale_name(name));
  }
  for (const char* name : {"self_attn.k_proj.weight_scale", "self_attn.k_proj.v_scale", "self_attn.sinks"}) {
    CAPTURE(name);
    CHECK_FALSE(is_kv_scale_name(name));
  }
}
