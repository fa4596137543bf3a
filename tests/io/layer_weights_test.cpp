// Layer weights by their HF names: save -> load round trips (prefix or none, fused or separate q/k/v,
// with and without biases, norms and sinks), the fused split by rows, a checkpoint-like file with many
// layers and non-attention tensors, every kind of problem named in details(), and the conversions.
#include "io/layer_weights.hpp"

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/parse.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "io_testing.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

using attnplan::Error;
using attnplan::Stage;
using attnplan::config::AttentionConfig;
using attnplan::io::bf16_tensor;
using attnplan::io::Dtype;
using attnplan::io::element_size;
using attnplan::io::HostLayerWeights;
using attnplan::io::HostTensor;
using attnplan::io::load_layer_weights;
using attnplan::io::read_tensor;
using attnplan::io::SafetensorsFile;
using attnplan::io::SafetensorsWriter;
using attnplan::io::save_layer_weights;
using attnplan::io::to_bf16_bits;
using attnplan::io::to_doubles;
using attnplan::io::testing::pattern_bytes;
using attnplan::testing::TempDir;

namespace {

// hidden 64, Hq 4, Hkv 2, D 16: q rows 64, k rows 32, v rows 32 (Dv = D unless patched).
AttentionConfig small_config(const nlohmann::json& patch = nlohmann::json::object()) {
  nlohmann::json document = {
      {"schema", "attnplan/v1"}, {"hidden_size", 64}, {"query_heads", 4}, {"kv_heads", 2}, {"head_dim", 16}};
  document.merge_patch(patch);
  return attnplan::config::parse(document, "test");
}

const nlohmann::json kEverything = {{"qkv_bias", true},
                                    {"output_bias", true},
                                    {"qkv_norm", {{"query", true}, {"key", true}}},
                                    {"sinks", true},
                                    {"value_head_dim", 32}};

// BF16 values distinct per tensor (seed) and per element.
HostTensor bf16_values(std::vector<std::int64_t> shape, unsigned seed) {
  std::int64_t count = 1;
  for (const auto extent : shape) count *= extent;
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < bits.size(); ++i)
    bits[i] = static_cast<std::uint16_t>(0x3c00 + (seed * 977 + i * 13) % 0x800);
  return bf16_tensor(std::move(shape), bits);
}

HostTensor small_values(Dtype dtype, std::vector<std::int64_t> shape, unsigned seed) {
  std::int64_t count = 1;
  for (const auto extent : shape) count *= extent;
  return HostTensor{dtype, std::move(shape),
                    pattern_bytes(static_cast<std::size_t>(count) * element_size(dtype), seed)};
}

// Weights of the shapes `config` asks for; norms, biases and sinks in `small_dtype`.
HostLayerWeights make_weights(const AttentionConfig& config, unsigned seed = 0,
                              Dtype small_dtype = Dtype::bf16) {
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t q_rows = config.query_heads * config.head_dim;
  const std::int64_t k_rows = config.kv_heads * config.head_dim;
  const std::int64_t v_rows = config.kv_heads * config.value_head_dim;
  HostLayerWeights weights;
  weights.input_norm = small_values(small_dtype, {hidden}, seed + 1);
  weights.q_proj = bf16_values({q_rows, hidden}, seed + 2);
  weights.k_proj = bf16_values({k_rows, hidden}, seed + 3);
  weights.v_proj = bf16_values({v_rows, hidden}, seed + 4);
  weights.o_proj = bf16_values({hidden, std::int64_t{config.query_heads} * config.value_head_dim}, seed + 5);
  if (config.qkv_bias) {
    weights.q_bias = small_values(small_dtype, {q_rows}, seed + 6);
    weights.k_bias = small_values(small_dtype, {k_rows}, seed + 7);
    weights.v_bias = small_values(small_dtype, {v_rows}, seed + 8);
  }
  if (config.qkv_norm.query) weights.q_norm = small_values(small_dtype, {config.head_dim}, seed + 9);
  if (config.qkv_norm.key) weights.k_norm = small_values(small_dtype, {config.head_dim}, seed + 10);
  if (config.output_bias) weights.o_bias = small_values(small_dtype, {hidden}, seed + 11);
  if (config.sinks) weights.sinks = small_values(small_dtype, {config.query_heads}, seed + 12);
  return weights;
}

std::filesystem::path save(const TempDir& dir, const HostLayerWeights& weights, const std::string& prefix,
                           bool fused, const std::string& file_name = "layer.safetensors") {
  SafetensorsWriter writer;
  save_layer_weights(writer, weights, prefix, fused);
  writer.write(dir / file_name);
  return dir / file_name;
}

// A copy of `from` without the tensors in `drop`, plus whatever `add` writes.
std::filesystem::path edited(const TempDir& dir, const std::filesystem::path& from,
                             const std::set<std::string>& drop,
                             const std::function<void(SafetensorsWriter&)>& add = {}) {
  const SafetensorsFile source = SafetensorsFile::open(from);
  SafetensorsWriter writer;
  for (const auto& name : source.names()) {
    if (drop.count(name) == 0)
      writer.add(name, source.info(name).dtype, source.info(name).shape, source.bytes(name));
  }
  if (add) add(writer);
  writer.write(dir / "edited.safetensors");
  return dir / "edited.safetensors";
}

Error load_error(const std::filesystem::path& path, const AttentionConfig& config,
                 const std::string& prefix) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  Error error = expect_error([&] { load_layer_weights(file, config, prefix); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), path.string()));
  return error;
}

// The one detail that mentions `name`, failing the test when there is not exactly one.
std::string detail_about(const Error& error, const std::string& name) {
  std::vector<std::string> found;
  for (const auto& detail : error.details()) {
    if (contains(detail, name + ":")) found.push_back(detail);
  }
  INFO("details naming " << name);
  REQUIRE(found.size() == 1);
  return found.front();
}

std::vector<std::uint8_t> bits_as_bytes(std::initializer_list<std::uint16_t> bits) {
  std::vector<std::uint8_t> bytes;
  for (const auto value : bits) {
    bytes.push_back(static_cast<std::uint8_t>(value));
    bytes.push_back(static_cast<std::uint8_t>(value >> 8));
  }
  return bytes;
}

}  // namespace

TEST_CASE("layer weights round-trip: prefix or none, fused or separate, optional tensors",
          "[io][layer_weights]") {
  const std::string prefix = GENERATE(std::string(""), std::string("model.layers.7."));
  const bool fused = GENERATE(false, true);
  const bool everything = GENERATE(false, true);
  CAPTURE(prefix, fused, everything);
  nlohmann::json patch = everything ? kEverything : nlohmann::json::object();
  patch["projection"] = {{"fused_qkv", fused}};
  const AttentionConfig config = small_config(patch);

  TempDir dir;
  const HostLayerWeights weights = make_weights(config);
  const auto path = save(dir, weights, prefix, fused);
  const SafetensorsFile file = SafetensorsFile::open(path);
  CHECK(file.contains(prefix + (fused ? "self_attn.qkv_proj.weight" : "self_attn.q_proj.weight")));
  CHECK_FALSE(file.contains(prefix + (fused ? "self_attn.q_proj.weight" : "self_attn.qkv_proj.weight")));
  CHECK(file.contains(prefix + "self_attn.qkv_proj.bias") == (fused && everything));

  const HostLayerWeights loaded = load_layer_weights(file, config, prefix);
  CHECK(loaded == weights);
  CHECK(loaded.sinks.has_value() == everything);
  if (everything) CHECK(loaded.v_proj.shape == std::vector<std::int64_t>{64, 64});  // Hkv * Dv = 2 * 32
}

TEST_CASE("a fused qkv_proj is split by rows into q, k and v", "[io][layer_weights]") {
  const AttentionConfig config = small_config({{"projection", {{"fused_qkv", true}}}, {"qkv_bias", true}});
  // Rows 0..63 are q, 64..95 k, 96..127 v; every element of row r holds r, every bias element its index.
  std::vector<std::uint16_t> rows(128 * 64), bias(128);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint16_t>(i / 64);
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<std::uint16_t>(1000 + i);
  const HostLayerWeights reference = make_weights(config);

  TempDir dir;
  SafetensorsWriter writer;
  writer.add("input_layernorm.weight", Dtype::bf16, {64}, reference.input_norm.bytes);
  writer.add("self_attn.qkv_proj.weight", Dtype::bf16, {128, 64}, bf16_tensor({128, 64}, rows).bytes);
  writer.add("self_attn.qkv_proj.bias", Dtype::bf16, {128}, bf16_tensor({128}, bias).bytes);
  writer.add("self_attn.o_proj.weight", Dtype::bf16, {64, 64}, reference.o_proj.bytes);
  writer.write(dir / "fused.safetensors");

  const HostLayerWeights loaded =
      load_layer_weights(SafetensorsFile::open(dir / "fused.safetensors"), config, "");
  CHECK(loaded.q_proj.shape == std::vector<std::int64_t>{64, 64});
  CHECK(loaded.k_proj.shape == std::vector<std::int64_t>{32, 64});
  CHECK(loaded.v_proj.shape == std::vector<std::int64_t>{32, 64});
  const auto q = to_bf16_bits(loaded.q_proj), k = to_bf16_bits(loaded.k_proj),
             v = to_bf16_bits(loaded.v_proj);
  CHECK(q.front() == 0);
  CHECK(q.back() == 63);
  CHECK(k.front() == 64);
  CHECK(k.back() == 95);
  CHECK(v.front() == 96);
  CHECK(v.back() == 127);
  REQUIRE(loaded.q_bias);
  REQUIRE(loaded.k_bias);
  REQUIRE(loaded.v_bias);
  CHECK(loaded.q_bias->shape == std::vector<std::int64_t>{64});
  CHECK(to_bf16_bits(*loaded.k_bias).front() == 1064);
  CHECK(to_bf16_bits(*loaded.v_bias).back() == 1127);
}

TEST_CASE("a fused qkv_proj may come with separate biases", "[io][layer_weights]") {
  const AttentionConfig config = small_config({{"projection", {{"fused_qkv", true}}}, {"qkv_bias", true}});
  TempDir dir;
  const HostLayerWeights weights = make_weights(config);
  const auto fused = save(dir, weights, "", true, "fused.safetensors");
  const auto separate_biases =
      edited(dir, fused, {"self_attn.qkv_proj.bias"}, [&](SafetensorsWriter& writer) {
        writer.add("self_attn.q_proj.bias", Dtype::bf16, {64}, weights.q_bias->bytes);
        writer.add("self_attn.k_proj.bias", Dtype::bf16, {32}, weights.k_bias->bytes);
        writer.add("self_attn.v_proj.bias", Dtype::bf16, {32}, weights.v_bias->bytes);
      });
  CHECK(load_layer_weights(SafetensorsFile::open(separate_biases), config, "") == weights);

  // Neither form: the separate ones are reported missing, saying the fused one would do too.
  const auto no_biases = edited(dir, fused, {"self_attn.qkv_proj.bias"});
  const auto error = load_error(no_biases, config, "");
  CHECK(error.details().size() == 3);
  CHECK(contains(
      detail_about(error, "self_attn.k_proj.bias"),
      "missing (expected BF16, F16 or F32 [32] = [kv_heads * head_dim], because qkv_bias is true and there "
      "is no fused self_attn.qkv_proj.bias)"));
}

TEST_CASE("norm weights, biases and sinks keep their F16 or F32 dtype", "[io][layer_weights]") {
  const Dtype dtype = GENERATE(Dtype::f16, Dtype::f32);
  const AttentionConfig config = small_config(kEverything);
  TempDir dir;
  const HostLayerWeights weights = make_weights(config, 3, dtype);
  const HostLayerWeights loaded =
      load_layer_weights(SafetensorsFile::open(save(dir, weights, "", false)), config, "");
  CHECK(loaded == weights);
  CHECK(loaded.input_norm.dtype == dtype);
  CHECK(loaded.sinks->dtype == dtype);
  CHECK(loaded.q_proj.dtype == Dtype::bf16);
}

TEST_CASE("one layer of a checkpoint-like file, ignoring what is not attention", "[io][layer_weights]") {
  const AttentionConfig config = small_config({{"qkv_norm", {{"query", true}, {"key", true}}}});
  TempDir dir;
  SafetensorsWriter writer;
  writer.add("model.embed_tokens.weight", Dtype::bf16, {10, 64}, bf16_values({10, 64}, 0).bytes);
  for (unsigned layer = 0; layer < 12; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    save_layer_weights(writer, make_weights(config, layer * 20), prefix, false);
    writer.add(prefix + "mlp.gate_proj.weight", Dtype::bf16, {128, 64}, bf16_values({128, 64}, layer).bytes);
    writer.add(prefix + "post_attention_layernorm.weight", Dtype::bf16, {64}, bf16_values({64}, layer).bytes);
    // Old conversions saved RoPE's inverse frequencies next to the weights: derived, not a weight.
    writer.add(prefix + "self_attn.rotary_emb.inv_freq", Dtype::f32, {8}, pattern_bytes(32, layer));
  }
  writer.add("lm_head.weight", Dtype::bf16, {10, 64}, bf16_values({10, 64}, 1).bytes);
  writer.write(dir / "model.safetensors");
  const SafetensorsFile file = SafetensorsFile::open(dir / "model.safetensors");

  CHECK(load_layer_weights(file, config, "model.layers.10.") == make_weights(config, 200));
  CHECK(load_layer_weights(file, config, "model.layers.1.") == make_weights(config, 20));

  SECTION("a wrong prefix says which prefixes the file has") {
    const std::string prefix =
        GENERATE(std::string("model.layer.3."), std::string(""), std::string("layers.3."));
    CAPTURE(prefix);
    const auto error = load_error(dir / "model.safetensors", config, prefix);
    REQUIRE_FALSE(error.details().empty());
    CHECK(error.details().front() ==
          "no attention weights under the prefix \"" + prefix +
              "\"; the file has layers under \"model.layers.0.\" .. \"model.layers.11.\" (12 prefixes)");
    CHECK(contains(detail_about(error, prefix + "self_attn.q_norm.weight"),
                   "the file has it under \"model.layers.0.\" .. \"model.layers.11.\" (12 prefixes)"));
    CHECK(contains(error.message(), std::to_string(error.details().size()) +
                                        " problems in the attention weights under \"" + prefix + "\""));
  }

  SECTION("a prefix without its dot is close to the real names") {
    const auto error = load_error(dir / "model.safetensors", config, "model.layers.3");
    CHECK(contains(detail_about(error, "model.layers.3self_attn.o_proj.weight"),
                   "the file has it under \"model.layers.0.\" .. \"model.layers.11.\" (12 prefixes)"));
  }
}

TEST_CASE("a missing tensor is named with its expected dtype, shape and reason", "[io][layer_weights]") {
  const AttentionConfig config = small_config({{"qkv_norm", {{"query", true}}}});
  TempDir dir;
  const auto path = save(dir, make_weights(config), "model.layers.0.", false);

  auto error =
      load_error(edited(dir, path, {"model.layers.0.self_attn.k_proj.weight"}), config, "model.layers.0.");
  REQUIRE(error.details().size() == 1);
  CHECK(error.details()[0] ==
        "model.layers.0.self_attn.k_proj.weight: missing (expected BF16 "
        "[32, 64] = [kv_heads * head_dim, hidden_size])");
  CHECK(contains(error.message(), "1 problem in the attention weights under \"model.layers.0.\""));
  CHECK(contains(error.message(), error.details()[0]));  // a single problem is in the message itself

  error =
      load_error(edited(dir, path, {"model.layers.0.self_attn.q_norm.weight"}), config, "model.layers.0.");
  CHECK(contains(detail_about(error, "model.layers.0.self_attn.q_norm.weight"),
                 "missing (expected BF16, F16 or F32 [16] = [head_dim], because qkv_norm.query is true)"));

  // A typo in the file: the close name is suggested, and reported as unused.
  error = load_error(edited(dir, path, {"model.layers.0.self_attn.o_proj.weight"},
                            [](SafetensorsWriter& writer) {
                              writer.add("model.layers.0.self_attn.o_proj.weights", Dtype::bf16, {64, 64},
                                         bf16_values({64, 64}, 0).bytes);
                            }),
                     config, "model.layers.0.");
  CHECK(contains(detail_about(error, "model.layers.0.self_attn.o_proj.weight"),
                 "similar names in the file: \"model.layers.0.self_attn.o_proj.weights\""));
  CHECK(contains(detail_about(error, "model.layers.0.self_attn.o_proj.weights"),
                 "present but unused (BF16 [64, 64]): not a tensor of this attention config"));
}

TEST_CASE("a wrong dtype is named with the dtypes accepted", "[io][layer_weights]") {
  const AttentionConfig config = small_config({{"qkv_bias", true}});
  TempDir dir;
  const auto path = save(dir, make_weights(config), "", false);
  const auto error = load_error(
      edited(dir, path, {"self_attn.q_proj.weight", "self_attn.v_proj.bias"},
             [](SafetensorsWriter& writer) {
               writer.add("self_attn.q_proj.weight", Dtype::f32, {64, 64}, pattern_bytes(64 * 64 * 4, 0));
               writer.add("self_attn.v_proj.bias", Dtype::i32, {32}, pattern_bytes(128, 0));
             }),
      config, "");
  REQUIRE(error.details().size() == 2);
  CHECK(detail_about(error, "self_attn.q_proj.weight") ==
        "self_attn.q_proj.weight: dtype F32, expected BF16");
  CHECK(detail_about(error, "self_attn.v_proj.bias") ==
        "self_attn.v_proj.bias: dtype I32, expected BF16, F16 or F32");
}

TEST_CASE("a wrong shape is named with the expected shape in config terms", "[io][layer_weights]") {
  const AttentionConfig config = small_config({{"sinks", true}});
  TempDir dir;
  const auto path = save(dir, make_weights(config), "L.", false);
  const auto error = load_error(
      edited(dir, path, {"L.self_attn.k_proj.weight", "L.self_attn.o_proj.weight", "L.self_attn.sinks"},
             [](SafetensorsWriter& writer) {
               writer.add("L.self_attn.k_proj.weight", Dtype::bf16, {64, 64}, bf16_values({64, 64}, 0).bytes);
               writer.add("L.self_attn.o_proj.weight", Dtype::bf16, {64, 32, 2},
                          bf16_values({64, 32, 2}, 0).bytes);
               writer.add("L.self_attn.sinks", Dtype::f32, {}, pattern_bytes(4, 0));
             }),
      config, "L.");
  REQUIRE(error.details().size() == 3);
  CHECK(detail_about(error, "L.self_attn.k_proj.weight") ==
        "L.self_attn.k_proj.weight: shape [64, 64], expected [32, 64] = [kv_heads * head_dim, hidden_size]");
  CHECK(detail_about(error, "L.self_attn.o_proj.weight") ==
        "L.self_attn.o_proj.weight: shape [64, 32, 2], expected [64, 64] = [hidden_size, query_heads * "
        "value_head_dim]");
  CHECK(detail_about(error, "L.self_attn.sinks") ==
        "L.self_attn.sinks: shape [], expected [4] = [query_heads]");
}

TEST_CASE("tensors the config would ignore are errors, with the setting that ignores them",
          "[io][layer_weights]") {
  const AttentionConfig config = small_config();
  TempDir dir;
  const auto path = save(dir, make_weights(config), "", false);
  const auto error = load_error(
      edited(dir, path, {},
             [](SafetensorsWriter& writer) {
               writer.add("self_attn.q_norm.weight", Dtype::bf16, {16}, bf16_values({16}, 0).bytes);
               writer.add("self_attn.k_proj.bias", Dtype::bf16, {32}, bf16_values({32}, 0).bytes);
               writer.add("self_attn.o_proj.bias", Dtype::bf16, {64}, bf16_values({64}, 0).bytes);
               writer.add("self_attn.sinks", Dtype::f32, {4}, pattern_bytes(16, 0));
               writer.add("self_attn.q_proj.weight_scale", Dtype::f32, {}, pattern_bytes(4, 0));
               writer.add("input_layernorm.bias", Dtype::bf16, {64}, bf16_values({64}, 0).bytes);
               // Not the attention's: ignored.
               writer.add("mlp.up_proj.weight", Dtype::bf16, {8, 64}, bf16_values({8, 64}, 0).bytes);
               writer.add("self_attn.rotary_emb.inv_freq", Dtype::f32, {8}, pattern_bytes(32, 0));
             }),
      config, "");
  REQUIRE(error.details().size() == 6);
  CHECK(detail_about(error, "self_attn.q_norm.weight") ==
        "self_attn.q_norm.weight: present but unused (BF16 [16]): qkv_norm.query is false");
  CHECK(contains(detail_about(error, "self_attn.k_proj.bias"), "qkv_bias is false"));
  CHECK(contains(detail_about(error, "self_attn.o_proj.bias"), "output_bias is false"));
  CHECK(contains(detail_about(error, "self_attn.sinks"), "present but unused (F32 [4]): sinks is false"));
  CHECK(contains(detail_about(error, "self_attn.q_proj.weight_scale"),
                 "not a tensor of this attention config"));
  CHECK(contains(detail_about(error, "input_layernorm.bias"), "present but unused"));
}

TEST_CASE("fused and separate layouts that disagree with the config point at fused_qkv",
          "[io][layer_weights]") {
  TempDir dir;
  const AttentionConfig separate = small_config();
  const AttentionConfig fused = small_config({{"projection", {{"fused_qkv", true}}}});

  auto error = load_error(save(dir, make_weights(separate), "", false, "separate.safetensors"), fused, "");
  CHECK(contains(
      detail_about(error, "self_attn.qkv_proj.weight"),
      "missing (expected BF16 [128, 64] = [query_heads * head_dim + "
      "kv_heads * head_dim + kv_heads * value_head_dim, hidden_size], because projection.fused_qkv is true); "
      "the file has separate q/k/v_proj weights instead"));
  CHECK(contains(detail_about(error, "self_attn.v_proj.weight"),
                 "present but unused (BF16 [32, 64]): projection.fused_qkv is true"));

  error = load_error(save(dir, make_weights(fused), "", true, "fused.safetensors"), separate, "");
  REQUIRE(error.details().size() == 4);  // q, k, v missing; qkv_proj unused
  CHECK(contains(detail_about(error, "self_attn.q_proj.weight"),
                 "the file has a fused self_attn.qkv_proj.weight instead (set projection.fused_qkv)"));
  CHECK(contains(detail_about(error, "self_attn.qkv_proj.weight"), "projection.fused_qkv is false"));
}

TEST_CASE("every problem is collected into one error", "[io][layer_weights]") {
  const AttentionConfig config = small_config({{"output_bias", true}});
  TempDir dir;
  const auto path = save(dir, make_weights(config), "model.layers.2.", false);
  const auto error = load_error(
      edited(dir, path, {"model.layers.2.self_attn.o_proj.bias", "model.layers.2.input_layernorm.weight"},
             [](SafetensorsWriter& writer) {
               writer.add("model.layers.2.input_layernorm.weight", Dtype::u8, {63}, pattern_bytes(63, 0));
               writer.add("model.layers.2.self_attn.k_norm.weight", Dtype::bf16, {16},
                          bf16_values({16}, 0).bytes);
             }),
      config, "model.layers.2.");
  CHECK(error.details().size() == 4);  // o bias missing, norm dtype and shape, k_norm unused
  CHECK(contains(error.message(), "4 problems in the attention weights under \"model.layers.2.\""));
  CHECK(contains(detail_about(error, "model.layers.2.self_attn.o_proj.bias"), "because output_bias is true"));
  CHECK(contains(detail_about(error, "model.layers.2.self_attn.k_norm.weight"), "qkv_norm.key is false"));
}

TEST_CASE("a bf16 file under a quantized config names the format's tensors", "[io][layer_weights]") {
  TempDir dir;
  const auto path = save(dir, make_weights(small_config()), "", false);
  const auto file = SafetensorsFile::open(path);
  const AttentionConfig config = small_config({{"projection", {{"output", {{"format", "mxfp8"}}}}}});
  const auto error = expect_error([&] { load_layer_weights(file, config, ""); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(detail_about(error, "self_attn.o_proj.weight"), "dtype BF16, expected F8_E4M3"));
  CHECK(contains(detail_about(error, "self_attn.o_proj.weight_scale"),
                 "missing (expected U8 [64, 2] = [N, K / 32] (E8M0) with N = hidden_size, K = query_heads * "
                 "value_head_dim, because projection format is mxfp8)"));

  const AttentionConfig fused = small_config({{"projection", {{"format", "fp8"}, {"fused_qkv", true}}}});
  CHECK(contains(expect_error([&] { load_layer_weights(file, fused, ""); }).message(),
                 "projection.fused_qkv with format fp8 is not supported"));
}

TEST_CASE("save_layer_weights refuses what cannot be fused", "[io][layer_weights]") {
  const AttentionConfig config = small_config({{"qkv_bias", true}});
  HostLayerWeights weights = make_weights(config);
  weights.k_bias.reset();
  SafetensorsWriter writer;
  auto error = expect_error([&] { save_layer_weights(writer, weights, "", true); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), "cannot fuse q/k/v biases: only 2 of 3 present"));

  weights = make_weights(config);
  weights.v_proj = bf16_values({32, 48}, 0);
  SafetensorsWriter other;
  error = expect_error([&] { save_layer_weights(other, weights, "", true); });
  CHECK(contains(error.message(),
                 "cannot fuse q/k/v_proj weights: BF16 [32, 48] does not stack with BF16 [64, 64]"));
}

TEST_CASE("to_doubles and to_bf16_bits read BF16, F16, F32 and F64", "[io][layer_weights]") {
  const HostTensor bf16{Dtype::bf16, {3}, bits_as_bytes({0x3f80, 0xc000, 0x3eab})};
  CHECK(to_doubles(bf16) == std::vector<double>{1.0, -2.0, 0.333984375});
  CHECK(to_bf16_bits(bf16) == std::vector<std::uint16_t>{0x3f80, 0xc000, 0x3eab});

  // 0x3555 is the half nearest 1/3 (0.333251953125); its 11 significant bits round up to bf16 0x3eab.
  const HostTensor f16{Dtype::f16, {2, 2}, bits_as_bytes({0x3c00, 0x3555, 0x0001, 0xfc00})};
  const auto f16_values = to_doubles(f16);
  CHECK(f16_values[0] == 1.0);
  CHECK(f16_values[1] == 0.333251953125);
  CHECK(f16_values[2] == 0x1p-24);
  CHECK(f16_values[3] == -std::numeric_limits<double>::infinity());
  CHECK(to_bf16_bits(f16) == std::vector<std::uint16_t>{0x3f80, 0x3eab, 0x3380, 0xff80});

  const std::vector<float> floats{1.5f, 1.0f + 0x1p-8f, -0.0f};  // the middle one is a tie, to even: 1.0
  HostTensor f32{Dtype::f32, {3}, std::vector<std::uint8_t>(12)};
  std::memcpy(f32.bytes.data(), floats.data(), 12);
  CHECK(to_doubles(f32) == std::vector<double>{1.5, 1.0 + 0x1p-8, 0.0});
  CHECK(to_bf16_bits(f32) == std::vector<std::uint16_t>{0x3fc0, 0x3f80, 0x8000});

  // 1 + 2^-8 + 2^-40 is above the tie: rounded straight from double it goes up, which a detour through
  // float (where it becomes the tie) would miss.
  const std::vector<double> doubles{1.0 + 0x1p-8 + 0x1p-40};
  HostTensor f64{Dtype::f64, {}, std::vector<std::uint8_t>(8)};
  std::memcpy(f64.bytes.data(), doubles.data(), 8);
  CHECK(to_doubles(f64) == std::vector<double>{1.0 + 0x1p-8 + 0x1p-40});
  CHECK(to_bf16_bits(f64) == std::vector<std::uint16_t>{0x3f81});

  const HostTensor empty{Dtype::f32, {0, 4}, {}};
  CHECK(to_doubles(empty).empty());
}

TEST_CASE("conversions refuse other dtypes and bytes that do not match the shape", "[io][layer_weights]") {
  auto error = expect_error([] { to_doubles(HostTensor{Dtype::i32, {1}, {0, 0, 0, 0}}); });
  CHECK(error.stage() == Stage::input);
  CHECK(error.message() == "to_doubles: dtype I32 is not BF16, F16, F32 or F64");
  error = expect_error([] { to_bf16_bits(HostTensor{Dtype::f8_e4m3, {0}, {}}); });
  CHECK(contains(error.message(), "to_bf16_bits: dtype F8_E4M3"));
  error = expect_error([] { to_doubles(HostTensor{Dtype::bf16, {2}, {0, 0, 0}}); });
  CHECK(error.message() == "to_doubles: 3 bytes do not match shape [2] of BF16");
  const std::vector<std::uint16_t> three(3);
  error = expect_error([&] { bf16_tensor({2, 2}, three); });
  CHECK(contains(error.message(), "bf16_tensor: 6 bytes do not match shape [2, 2] of BF16"));
}

TEST_CASE("read_tensor copies one tensor out of the file", "[io][layer_weights]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.add("t", Dtype::i16, {2}, std::vector<std::uint8_t>{1, 2, 3, 4});
  writer.write(dir / "t.safetensors");
  const SafetensorsFile file = SafetensorsFile::open(dir / "t.safetensors");
  const HostTensor tensor = read_tensor(file, "t");
  CHECK(tensor == HostTensor{Dtype::i16, {2}, {1, 2, 3, 4}});
  CHECK(tensor.element_count() == 2);
  CHECK(contains(expect_error([&] { read_tensor(file, "u"); }).message(), "no tensor named \"u\""));
}

TEST_CASE("an fp8 cache takes the layer's k_scale / v_scale; a bf16 cache leaves them unused",
          "[io][layer_weights][kv_scales]") {
  const AttentionConfig bf16_cache = small_config();
  const AttentionConfig fp8_cache = small_config({{"kv_cache", {{"dtype", "fp8_e4m3"}}}});
  TempDir dir;
  const std::string prefix = "model.layers.2.";
  const auto path = save(dir, make_weights(bf16_cache), prefix, false);
  const float k_scale = 0.0421f, v_scale = 0.0173f;
  std::vector<std::uint8_t> k_bytes(4), v_bytes(4);
  std::memcpy(k_bytes.data(), &k_scale, 4);
  std::memcpy(v_bytes.data(), &v_scale, 4);
  const auto with_scales = edited(dir, path, {}, [&](SafetensorsWriter& writer) {
    writer.add(prefix + "self_attn.k_proj.k_scale", Dtype::f32, {}, k_bytes);  // ModelOpt names
    writer.add(prefix + "self_attn.v_proj.v_scale", Dtype::f32, {1}, v_bytes);
  });
  const SafetensorsFile file = SafetensorsFile::open(with_scales);

  const HostLayerWeights fp8 = load_layer_weights(file, fp8_cache, prefix);
  REQUIRE(fp8.kv_scales);
  CHECK(fp8.kv_scales->k_scale == k_scale);
  CHECK(fp8.kv_scales->v_scale == v_scale);
  CHECK(fp8.kv_scales->k_source == prefix + "self_attn.k_proj.k_scale");

  const HostLayerWeights bf16 = load_layer_weights(file, bf16_cache, prefix);
  CHECK_FALSE(bf16.kv_scales);
  CHECK(bf16.q_proj == fp8.q_proj);

  // Scale problems join the weights' problems in one error.
  const auto broken = edited(dir, path, {prefix + "self_attn.o_proj.weight"});
  const Error error = load_error(broken, fp8_cache, prefix);
  REQUIRE(error.details().size() == 3);
  CHECK(contains(detail_about(error, prefix + "self_attn.o_proj.weight"), "missing"));
  CHECK(contains(error.details()[1], "no k cache scale"));
  CHECK(contains(error.details()[2], "no v cache scale"));
}
