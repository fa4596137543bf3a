// Quantized projections in the checkpoint: every format's tensors saved by their checkpoint names and
// loaded back unchanged (q/k/v and o in different formats), gpt-oss `_blocks` / `_scales`, optional GPTQ
// g_idx, and wrong dtypes / shapes named with the expected and the actual.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/parse.hpp"
#include "core/error.hpp"
#include "io/layer_weights.hpp"
#include "io/projection_format.hpp"
#include "io/random_projection.hpp"
#include "io/safetensors.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;
using attnplan::io::HostLayerWeights;
using attnplan::io::SafetensorsFile;
using attnplan::io::SafetensorsWriter;
using attnplan::testing::TempDir;

namespace {

// hidden 128, Hq 4, Hkv 2, D 32: q [128, 128], k/v [64, 128], o [128, 128].
config::AttentionConfig quant_config(const nlohmann::json& qkv, const nlohmann::json& output) {
  nlohmann::json document = {{"schema", "attnplan/v1"}, {"hidden_size", 128},
                             {"query_heads", 4},        {"kv_heads", 2},
                             {"head_dim", 32},          {"projection", {{"output", output}}}};
  for (const auto& [key, value] : qkv.items()) document["projection"][key] = value;
  return config::parse(document, "test");
}

HostLayerWeights random_weights(const config::AttentionConfig& config, unsigned seed) {
  HostLayerWeights w;
  w.input_norm = io::random_projection({}, 1, 128, 1.0, seed).weight;
  w.input_norm.shape = {128};
  const auto fill = [&](const config::WeightEncoding& encoding, std::int64_t n, std::int64_t k,
                        io::HostTensor& weight, io::QuantizationTensors& quant, unsigned salt) {
    auto random = io::random_projection(encoding, n, k, 0.1, seed * 17 + salt);
    weight = random.weight;
    quant = random.quant;
  };
  fill(config.projection.qkv, 128, 128, w.q_proj, w.q_quant, 1);
  fill(config.projection.qkv, 64, 128, w.k_proj, w.k_quant, 2);
  fill(config.projection.qkv, 64, 128, w.v_proj, w.v_quant, 3);
  fill(config.projection.output, 128, 128, w.o_proj, w.o_quant, 4);
  return w;
}

std::filesystem::path save(const TempDir& dir, const HostLayerWeights& weights,
                           const config::AttentionConfig& config, const std::string& prefix) {
  SafetensorsWriter writer;
  io::save_layer_weights(writer, weights, prefix, config.projection);
  const auto path = dir.path() / "layer.safetensors";
  writer.write(path);
  return path;
}

const nlohmann::json kFormats[] = {
    {{"format", "bf16"}},
    {{"format", "fp8"}, {"scale_granularity", "tensor"}},
    {{"format", "fp8"}, {"scale_granularity", "channel"}},
    {{"format", "fp8"}, {"scale_granularity", "block"}},
    {{"format", "mxfp8"}},
    {{"format", "mxfp4"}},
    {{"format", "nvfp4"}},
    {{"format", "packed_integer"}, {"scheme", "gptq"}, {"bits", 4}, {"group_size", 32}},
    {{"format", "packed_integer"}, {"scheme", "gptq"}, {"bits", 4}, {"group_size", 32}, {"act_order", true}},
    {{"format", "packed_integer"}, {"scheme", "gptq_v2"}, {"bits", 8}, {"group_size", -1}},
    {{"format", "packed_integer"}, {"scheme", "awq"}, {"bits", 4}, {"group_size", 64}},
    {{"format", "affine"}, {"bits", 3}, {"group_size", 32}},
    {{"format", "affine"}, {"bits", 4}, {"group_size", 64}},
    {{"format", "affine"}, {"bits", 6}, {"group_size", 128}},
};

}  // namespace

TEST_CASE("every projection format round-trips through save and load", "[io][quantized]") {
  TempDir dir;
  for (const auto& qkv : kFormats) {
    // o_proj in another format than q/k/v: the next one in the list.
    const auto& output = kFormats[(&qkv - kFormats + 1) % std::size(kFormats)];
    CAPTURE(qkv.dump(), output.dump());
    const auto config = quant_config(qkv, output);
    const HostLayerWeights weights = random_weights(config, 3);
    const auto path = save(dir, weights, config, "model.layers.1.");
    const auto file = SafetensorsFile::open(path);
    CHECK(io::load_layer_weights(file, config, "model.layers.1.") == weights);
  }
}

TEST_CASE("a quantized projection's static input_scale is part of the checkpoint, not an error",
          "[io][quantized]") {
  // ModelOpt FP8 / NVFP4 and static llm-compressor checkpoints carry a calibrated `input_scale` per
  // projection; attnplan quantizes activations itself (or runs weight-only) and does not read it.
  TempDir dir;
  const auto config =
      quant_config({{"format", "fp8"}, {"scale_granularity", "tensor"}}, {{"format", "bf16"}});
  const HostLayerWeights weights = random_weights(config, 5);
  SafetensorsWriter writer;
  io::save_layer_weights(writer, weights, "", config.projection);
  const std::vector<std::uint8_t> scale = {0x00, 0x00, 0x80, 0x3f};  // f32 1.0
  for (const char* name : {"q", "k", "v"})
    writer.add(std::string("self_attn.") + name + "_proj.input_scale", io::Dtype::f32, {}, scale);
  const auto path = dir.path() / "static.safetensors";
  writer.write(path);
  CHECK(io::load_layer_weights(SafetensorsFile::open(path), config, "") == weights);

  // o_proj is bf16 here: its input_scale would mean the config and the checkpoint disagree.
  SafetensorsWriter mismatched;
  io::save_layer_weights(mismatched, weights, "", config.projection);
  mismatched.add("self_attn.o_proj.input_scale", io::Dtype::f32, {}, scale);
  const auto bad = dir.path() / "mismatched.safetensors";
  mismatched.write(bad);
  const auto error = expect_error([&] { io::load_layer_weights(SafetensorsFile::open(bad), config, ""); });
  CHECK(contains(error.details().at(0),
                 "self_attn.o_proj.input_scale: present but unused (F32 []): a static activation scale of a "
                 "bf16 projection"));
}

TEST_CASE("GPTQ checkpoints are read by their names in [K, N] storage", "[io][quantized]") {
  TempDir dir;
  const auto config = quant_config({{"format", "packed_integer"}, {"scheme", "gptq"}, {"group_size", 32}},
                                   {{"format", "bf16"}});
  const auto path = save(dir, random_weights(config, 1), config, "");
  const auto file = SafetensorsFile::open(path);
  CHECK(file.info("self_attn.k_proj.qweight").shape == std::vector<std::int64_t>{16, 64});  // [K / 8, N]
  CHECK(file.info("self_attn.k_proj.qzeros").shape == std::vector<std::int64_t>{4, 8});     // [K / G, N / 8]
  CHECK(file.info("self_attn.k_proj.scales").shape == std::vector<std::int64_t>{4, 64});
  CHECK_FALSE(file.contains("self_attn.k_proj.g_idx"));  // optional without act_order
  CHECK(file.contains("self_attn.o_proj.weight"));
}

TEST_CASE("gpt-oss mxfp4 _blocks / _scales load as the standard layout", "[io][quantized]") {
  TempDir dir;
  const auto config = quant_config({{"format", "mxfp4"}}, {{"format", "mxfp4"}});
  const HostLayerWeights weights = random_weights(config, 2);
  SafetensorsWriter writer;
  writer.add("input_layernorm.weight", weights.input_norm.dtype, weights.input_norm.shape,
             weights.input_norm.bytes);
  const auto add = [&](const std::string& base, const io::HostTensor& weight,
                       const io::QuantizationTensors& quant) {
    const std::int64_t n = weight.shape[0], k = weight.shape[1] * 2;
    writer.add(base + "_blocks", io::Dtype::u8, {n, k / 32, 16}, weight.bytes);
    writer.add(base + "_scales", io::Dtype::u8, quant.scales->shape, quant.scales->bytes);
  };
  add("self_attn.q_proj", weights.q_proj, weights.q_quant);
  add("self_attn.k_proj", weights.k_proj, weights.k_quant);
  add("self_attn.v_proj", weights.v_proj, weights.v_quant);
  add("self_attn.o_proj", weights.o_proj, weights.o_quant);
  const auto path = dir.path() / "gpt_oss.safetensors";
  writer.write(path);
  CHECK(io::load_layer_weights(SafetensorsFile::open(path), config, "") == weights);
}

TEST_CASE("quantized tensors of the wrong dtype or shape are named with expected and actual",
          "[io][quantized]") {
  TempDir dir;
  const auto config = quant_config({{"format", "nvfp4"}}, {{"format", "bf16"}});
  HostLayerWeights weights = random_weights(config, 4);
  weights.k_quant.scales->dtype = io::Dtype::u8;  // e4m3 expected
  weights.v_quant.scales->shape = {64, 4};
  weights.v_quant.scales->bytes.resize(256);
  weights.q_quant.scale_2.reset();
  SafetensorsWriter writer;
  // save writes what it has: drop q's scale_2 by writing a bf16-style q separately.
  auto error = expect_error([&] { io::save_layer_weights(writer, weights, "", config.projection); });
  CHECK(contains(error.message(), "self_attn.q_proj has no tensor for self_attn.q_proj.weight_scale_2"));

  weights.q_quant.scale_2 = io::random_projection(config.projection.qkv, 128, 128, 0.1, 9).quant.scale_2;
  const auto path = save(dir, weights, config, "");
  error = expect_error([&] { io::load_layer_weights(SafetensorsFile::open(path), config, ""); });
  REQUIRE(error.details().size() == 2);
  CHECK(error.details()[0] == "self_attn.k_proj.weight_scale: dtype U8, expected F8_E4M3");
  CHECK(error.details()[1] ==
        "self_attn.v_proj.weight_scale: shape [64, 4], expected [64, 8] = [N, K / 16] with N = kv_heads * "
        "value_head_dim, K = hidden_size");
}

TEST_CASE("packings that the shape cannot hold are refused", "[io][quantized]") {
  config::WeightEncoding awq;
  awq.format = config::WeightFormat::packed_integer;
  awq.scheme = config::PackedIntegerScheme::awq;
  awq.group_size = 32;
  CHECK(
      contains(expect_error([&] { io::projection_tensor_rules(awq, "self_attn.k_proj", 60, 128); }).message(),
               "self_attn.k_proj: N 60 is not a multiple of 8, which packed_integer packing needs"));
}
