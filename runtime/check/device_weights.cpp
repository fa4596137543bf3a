#include "check/device_weights.hpp"

#include <cstdint>

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

}  // namespace

DeviceWeights upload_weights(const config::AttentionConfig& config, const io::HostLayerWeights& w) {
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
