#include "check/device_weights.hpp"

#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace attnplan::check {

namespace {

using Bits = std::vector<std::uint16_t>;

Bits concat(std::initializer_list<const io::HostTensor*> parts) {
  Bits all;
  for (const io::HostTensor* part : parts) {
    const Bits bits = io::to_bf16_bits(*part);
    all.insert(all.end(), bits.begin(), bits.end());
  }
  return all;
}

// What one tensor must be: a projection (bf16 only) or a small vector (bf16, f16 or f32).
void check_tensor(const std::string& name, const io::HostTensor& tensor, std::vector<std::int64_t> shape,
                  bool projection) {
  const bool dtype_ok = tensor.dtype == io::Dtype::bf16 ||
                        (!projection && (tensor.dtype == io::Dtype::f16 || tensor.dtype == io::Dtype::f32));
  if (!dtype_ok) {
    throw Error(Stage::input,
                fmt::format("weights.{}: dtype {}, expected {}", name, io::to_string(tensor.dtype),
                            projection ? "BF16 (projection weights)" : "BF16, F16 or F32"));
  }
  if (tensor.shape != shape) {
    throw Error(Stage::input, fmt::format("weights.{}: shape [{}], expected [{}]", name,
                                          fmt::join(tensor.shape, ", "), fmt::join(shape, ", ")));
  }
  if (tensor.bytes.size() != tensor.element_count() * io::element_size(tensor.dtype)) {
    throw Error(Stage::input,
                fmt::format("weights.{}: {} bytes, but shape [{}] of {} needs {}", name, tensor.bytes.size(),
                            fmt::join(shape, ", "), io::to_string(tensor.dtype),
                            tensor.element_count() * io::element_size(tensor.dtype)));
  }
}

void check_optional(const std::string& name, const std::optional<io::HostTensor>& tensor, bool wanted,
                    const char* setting, std::vector<std::int64_t> shape) {
  if (tensor && !wanted)
    throw Error(Stage::input, fmt::format("weights.{}: given, but {} is false", name, setting));
  if (!tensor && wanted)
    throw Error(Stage::input, fmt::format("weights.{}: missing, and {} is true", name, setting));
  if (tensor) check_tensor(name, *tensor, std::move(shape), false);
}

}  // namespace

void validate_host_weights(const config::AttentionConfig& config, const io::HostLayerWeights& w) {
  const std::int64_t hidden = config.hidden_size, hq = config.query_heads, hkv = config.kv_heads;
  const std::int64_t d = config.head_dim, dv = config.value_head_dim;
  check_tensor("input_norm", w.input_norm, {hidden}, false);
  check_tensor("q_proj", w.q_proj, {hq * d, hidden}, true);
  check_tensor("k_proj", w.k_proj, {hkv * d, hidden}, true);
  check_tensor("v_proj", w.v_proj, {hkv * dv, hidden}, true);
  check_optional("q_bias", w.q_bias, config.qkv_bias, "qkv_bias", {hq * d});
  check_optional("k_bias", w.k_bias, config.qkv_bias, "qkv_bias", {hkv * d});
  check_optional("v_bias", w.v_bias, config.qkv_bias, "qkv_bias", {hkv * dv});
  check_optional("q_norm", w.q_norm, config.qkv_norm.query, "qkv_norm.query", {d});
  check_optional("k_norm", w.k_norm, config.qkv_norm.key, "qkv_norm.key", {d});
  check_tensor("o_proj", w.o_proj, {hidden, hq * dv}, true);
  check_optional("o_bias", w.o_bias, config.output_bias, "output_bias", {hidden});
  check_optional("sinks", w.sinks, config.sinks, "sinks", {hq});
}

DeviceWeights upload_weights(const config::AttentionConfig& config, const io::HostLayerWeights& w) {
  validate_host_weights(config, w);  // before the first allocation: a bad tensor costs no device memory
  DeviceWeights device;
  device.buffers.reserve(16);  // the view points into the buffers: no reallocation may move them
  auto hold = [&](const Bits& bits) -> const void* {
    device.buffers.push_back(driver::DeviceBuffer::from_host(bits));
    return device.buffers.back().data<const void>();
  };
  auto hold_optional = [&](const std::optional<io::HostTensor>& tensor) -> const void* {
    return tensor ? hold(io::to_bf16_bits(*tensor)) : nullptr;
  };
  plan::LayerWeightsView& view = device.view;
  view.input_norm = hold(io::to_bf16_bits(w.input_norm));
  if (config.projection.fused_qkv) {
    view.qkv_proj = hold(concat({&w.q_proj, &w.k_proj, &w.v_proj}));
    if (w.q_bias && w.k_bias && w.v_bias) view.qkv_bias = hold(concat({&*w.q_bias, &*w.k_bias, &*w.v_bias}));
  } else {
    view.q_proj = hold(io::to_bf16_bits(w.q_proj));
    view.k_proj = hold(io::to_bf16_bits(w.k_proj));
    view.v_proj = hold(io::to_bf16_bits(w.v_proj));
    view.q_bias = hold_optional(w.q_bias);
    view.k_bias = hold_optional(w.k_bias);
    view.v_bias = hold_optional(w.v_bias);
  }
  view.q_norm = hold_optional(w.q_norm);
  view.k_norm = hold_optional(w.k_norm);
  view.o_proj = hold(io::to_bf16_bits(w.o_proj));
  view.o_bias = hold_optional(w.o_bias);
  if (w.sinks) {
    const std::vector<double> values = io::to_doubles(*w.sinks);
    const std::vector<float> floats(values.begin(), values.end());
    device.buffers.push_back(driver::DeviceBuffer::from_host(floats));
    view.sinks = device.buffers.back().data<const float>();
  }
  return device;
}

}  // namespace attnplan::check
