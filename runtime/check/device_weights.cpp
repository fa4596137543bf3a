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
  device.buffers.reserve(32);  // the view points into the buffers: no reallocation may move them
  auto hold = [&](const Bits& bits) -> const void* {
    device.buffers.push_back(driver::DeviceBuffer::from_host(bits));
    return device.buffers.back().data<const void>();
  };
  auto hold_optional = [&](const std::optional<io::HostTensor>& tensor) -> const void* {
    return tensor ? hold(io::to_bf16_bits(*tensor)) : nullptr;
  };
  // Quantized projections: the packed bytes as stored; fp8 scales as f32 (block scales may be stored as
  // BF16), the MX / nvfp4 scale bytes as stored, nvfp4's scale_2 as f32.
  auto hold_bytes = [&](const std::vector<std::uint8_t>& bytes) -> const void* {
    device.buffers.push_back(driver::DeviceBuffer::from_host(bytes));
    return device.buffers.back().data<const void>();
  };
  auto hold_floats = [&](const io::HostTensor& tensor) -> const float* {
    const std::vector<double> values = io::to_doubles(tensor);
    device.buffers.push_back(
        driver::DeviceBuffer::from_host(std::vector<float>(values.begin(), values.end())));
    return device.buffers.back().data<const float>();
  };
  struct Quantized {
    const void* weight;
    const void* scales;
    const float* scale_2;
  };
  auto hold_projection = [&](const config::WeightEncoding& encoding, const io::HostTensor& weight,
                             const io::QuantizationTensors& quant) -> Quantized {
    if (encoding.format == config::WeightFormat::bf16)
      return {hold(io::to_bf16_bits(weight)), nullptr, nullptr};
    Quantized held{hold_bytes(weight.bytes), nullptr, nullptr};
    if (quant.scales) {
      held.scales = encoding.format == config::WeightFormat::fp8 ? hold_floats(*quant.scales)
                                                                 : hold_bytes(quant.scales->bytes);
    }
    if (quant.scale_2) held.scale_2 = hold_floats(*quant.scale_2);
    return held;
  };
  plan::LayerWeightsView& view = device.view;
  view.input_norm = hold(io::to_bf16_bits(w.input_norm));
  if (config.projection.fused_qkv) {
    view.qkv_proj = hold(concat({&w.q_proj, &w.k_proj, &w.v_proj}));
    if (w.q_bias && w.k_bias && w.v_bias) view.qkv_bias = hold(concat({&*w.q_bias, &*w.k_bias, &*w.v_bias}));
  } else {
    const Quantized q = hold_projection(config.projection.qkv, w.q_proj, w.q_quant);
    const Quantized k = hold_projection(config.projection.qkv, w.k_proj, w.k_quant);
    const Quantized v = hold_projection(config.projection.qkv, w.v_proj, w.v_quant);
    view.q_proj = q.weight;
    view.k_proj = k.weight;
    view.v_proj = v.weight;
    view.q_scales = q.scales;
    view.k_scales = k.scales;
    view.v_scales = v.scales;
    view.q_scale_2 = q.scale_2;
    view.k_scale_2 = k.scale_2;
    view.v_scale_2 = v.scale_2;
    view.q_bias = hold_optional(w.q_bias);
    view.k_bias = hold_optional(w.k_bias);
    view.v_bias = hold_optional(w.v_bias);
  }
  view.q_norm = hold_optional(w.q_norm);
  view.k_norm = hold_optional(w.k_norm);
  const Quantized o = hold_projection(config.projection.output, w.o_proj, w.o_quant);
  view.o_proj = o.weight;
  view.o_scales = o.scales;
  view.o_scale_2 = o.scale_2;
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
