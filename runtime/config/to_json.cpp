// AttentionConfig -> its canonical JSON. Canonical means: the same config always gives the same
// document (defaults resolved and written, keys sorted by nlohmann's map), so the text is fit for
// hashing and diffing, and parse() reads it back unchanged.
#include <cmath>
#include <cstdint>

#include "config/parse.hpp"

namespace attnplan::config {
namespace {

using nlohmann::json;

// Integral values print as integers ("theta": 500000, not 500000.0); both read back as the same double.
json number(double value) {
  constexpr double kExactIntegerLimit = 9007199254740992.0;  // 2^53
  if (std::isfinite(value) && std::trunc(value) == value && std::fabs(value) < kExactIntegerLimit) {
    return static_cast<std::int64_t>(value);
  }
  return value;
}

json optional_number(const std::optional<double>& value) {
  return value ? number(*value) : json(nullptr);
}
json optional_integer(const std::optional<int>& value) {
  return value ? json(*value) : json(nullptr);
}

json encoding_to_json(const WeightEncoding& encoding) {
  json out = {{"format", to_string(encoding.format)}};
  switch (encoding.format) {
    case WeightFormat::fp8:
      out["scale_granularity"] = to_string(encoding.scale_granularity);
      out["activation"] = to_string(encoding.activation);
      break;
    case WeightFormat::packed_integer:
      out["scheme"] = to_string(encoding.scheme);
      out["bits"] = encoding.bits;
      out["group_size"] = encoding.group_size;
      out["act_order"] = encoding.act_order;
      break;
    case WeightFormat::affine:
      out["bits"] = encoding.bits;
      out["group_size"] = encoding.group_size;
      break;
    default:
      break;
  }
  return out;
}

json scaling_to_json(const RopeScaling& scaling) {
  json out = {{"type", to_string(scaling.type)}};
  switch (scaling.type) {
    case RopeScalingType::none:
      break;
    case RopeScalingType::linear:
      out["factor"] = number(scaling.factor);
      break;
    case RopeScalingType::llama3:
      out["factor"] = number(scaling.factor);
      out["low_freq_factor"] = number(scaling.low_freq_factor);
      out["high_freq_factor"] = number(scaling.high_freq_factor);
      out["original_max_position"] = scaling.original_max_position;
      break;
    case RopeScalingType::yarn:
      out["factor"] = number(scaling.factor);
      out["original_max_position"] = scaling.original_max_position;
      out["beta_fast"] = number(scaling.beta_fast);
      out["beta_slow"] = number(scaling.beta_slow);
      out["truncate"] = scaling.truncate;
      out["attention_factor"] = optional_number(scaling.attention_factor);
      break;
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const AttentionConfig& unresolved) {
  AttentionConfig config = unresolved;
  resolve_defaults(config);

  json projection = encoding_to_json(config.projection.qkv);
  projection["fused_qkv"] = config.projection.fused_qkv;
  projection["output"] = encoding_to_json(config.projection.output);
  json kv_cache = {{"block_size", config.kv_cache.block_size}, {"dtype", to_string(config.kv_cache.dtype)}};
  // An fp8 cache writes its scales (null: not given, taken from the checkpoint); a bf16 cache only a given
  // scale (which validation allows to be 1 alone), so that parse(to_json(c)) == c.
  const bool fp8_cache = config.kv_cache.dtype == KvCacheDtype::fp8_e4m3;
  if (fp8_cache || config.kv_cache.k_scale) kv_cache["k_scale"] = optional_number(config.kv_cache.k_scale);
  if (fp8_cache || config.kv_cache.v_scale) kv_cache["v_scale"] = optional_number(config.kv_cache.v_scale);

  return {
      {"schema", kSchema},
      {"name", config.name},
      {"hidden_size", config.hidden_size},
      {"query_heads", config.query_heads},
      {"kv_heads", config.kv_heads},
      {"head_dim", config.head_dim},
      {"value_head_dim", config.value_head_dim},
      {"input_norm",
       {{"epsilon", number(config.input_norm.epsilon)},
        {"weight_offset", number(config.input_norm.weight_offset)}}},
      {"qkv_bias", config.qkv_bias},
      {"output_bias", config.output_bias},
      {"qkv_norm",
       {{"query", config.qkv_norm.query},
        {"key", config.qkv_norm.key},
        {"value", config.qkv_norm.value},
        {"weight_offset", number(config.qkv_norm.weight_offset)},
        {"epsilon", optional_number(config.qkv_norm.epsilon)}}},
      {"rotary",
       {{"offset", config.rotary.offset},
        {"dim", optional_integer(config.rotary.dim)},
        {"pairing_dim", optional_integer(config.rotary.pairing_dim)},
        {"theta", number(config.rotary.theta)},
        {"scaling", scaling_to_json(config.rotary.scaling)}}},
      {"attention_scale", optional_number(config.attention_scale)},
      {"softcap", optional_number(config.softcap)},
      {"sliding_window", optional_integer(config.sliding_window)},
      {"bidirectional_spans", config.bidirectional_spans},
      {"sinks", config.sinks},
      {"projection", projection},
      {"kv_cache", kv_cache},
      {"max_tokens", config.max_tokens},
      {"target", {{"arch", config.target.arch ? config.target.arch->name() : "auto"}}},
  };
}

}  // namespace attnplan::config
