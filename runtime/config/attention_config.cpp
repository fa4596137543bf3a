#include "config/attention_config.hpp"

#include <cmath>

#include "config/enum_names.hpp"
#include "config/parse.hpp"

namespace attnplan::config {

std::string_view to_string(RopeScalingType value) {
  return detail::enum_name(value);
}
std::string_view to_string(WeightFormat value) {
  return detail::enum_name(value);
}
std::string_view to_string(Fp8ScaleGranularity value) {
  return detail::enum_name(value);
}
std::string_view to_string(ActivationType value) {
  return detail::enum_name(value);
}
std::string_view to_string(PackedIntegerScheme value) {
  return detail::enum_name(value);
}
std::string_view to_string(KvCacheDtype value) {
  return detail::enum_name(value);
}
std::string_view to_string(Fp8ActivationScales value) {
  return detail::enum_name(value);
}

void resolve_defaults(AttentionConfig& config) {
  if (config.kv_heads == 0) config.kv_heads = config.query_heads;
  if (config.head_dim == 0 && config.query_heads > 0 && config.hidden_size % config.query_heads == 0) {
    config.head_dim = config.hidden_size / config.query_heads;
  }
  if (config.value_head_dim == 0) config.value_head_dim = config.head_dim;

  Rotary& rotary = config.rotary;
  // A negative default (offset past the head) is left unset so the problem is reported at /rotary/offset.
  if (!rotary.dim && config.head_dim > 0 && rotary.offset >= 0 && rotary.offset <= config.head_dim) {
    rotary.dim = config.head_dim - rotary.offset;
  }
  if (!rotary.pairing_dim && rotary.dim) rotary.pairing_dim = rotary.dim;

  RopeScaling& scaling = rotary.scaling;
  if (scaling.type == RopeScalingType::yarn && !scaling.attention_factor) {
    // HF get_mscale: no amplitude correction unless the context is actually stretched.
    scaling.attention_factor = scaling.factor <= 1.0 ? 1.0 : 0.1 * std::log(scaling.factor) + 1.0;
  }

  if (!config.qkv_norm.epsilon) config.qkv_norm.epsilon = config.input_norm.epsilon;
  if (!config.attention_scale && config.head_dim > 0) {
    config.attention_scale = 1.0 / std::sqrt(static_cast<double>(config.head_dim));
  }
}

}  // namespace attnplan::config
