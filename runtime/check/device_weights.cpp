#include "check/device_weights.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "io/projection_format.hpp"

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

// A projection in its config format: bf16 as check_tensor; a quantized one tensor by tensor against the
// format's rules (io/projection_format.hpp: dtypes and shapes, W stored as the checkpoint stores it).
void check_projection(const std::string& name, const config::WeightEncoding& encoding,
                      const io::HostTensor& weight, const io::QuantizationTensors& quant, std::int64_t n,
                      std::int64_t k) {
  if (encoding.format == config::WeightFormat::bf16) {
    check_tensor(name, weight, {n, k}, true);
    return;
  }
  for (const io::ProjectionTensorRule& rule : io::projection_tensor_rules(encoding, name, n, k)) {
    const io::HostTensor* tensor = nullptr;
    switch (rule.role) {
      case io::TensorRole::weight:
        tensor = &weight;
        break;
      case io::TensorRole::scales:
        tensor = quant.scales ? &*quant.scales : nullptr;
        break;
      case io::TensorRole::scale_2:
        tensor = quant.scale_2 ? &*quant.scale_2 : nullptr;
        break;
      case io::TensorRole::zeros:
        tensor = quant.zeros ? &*quant.zeros : nullptr;
        break;
      case io::TensorRole::g_idx:
        tensor = quant.g_idx ? &*quant.g_idx : nullptr;
        break;
    }
    const std::string label = fmt::format("weights.{} ({})", name, rule.relative);
    if (tensor == nullptr) {
      if (rule.optional) continue;
      throw Error(Stage::input,
                  fmt::format("{}: missing ({} weights)", label, config::to_string(encoding.format)));
    }
    if (std::find(rule.dtypes.begin(), rule.dtypes.end(), tensor->dtype) == rule.dtypes.end()) {
      throw Error(Stage::input, fmt::format("{}: dtype {}, not one the format stores", label,
                                            io::to_string(tensor->dtype)));
    }
    if (std::find(rule.shapes.begin(), rule.shapes.end(), tensor->shape) == rule.shapes.end()) {
      throw Error(Stage::input,
                  fmt::format("{}: shape [{}], expected {} = [{}]", label, fmt::join(tensor->shape, ", "),
                              rule.formula, fmt::join(rule.shapes.front(), ", ")));
    }
    if (tensor->bytes.size() != tensor->element_count() * io::element_size(tensor->dtype)) {
      throw Error(Stage::input, fmt::format("{}: {} bytes, its shape needs {}", label, tensor->bytes.size(),
                                            tensor->element_count() * io::element_size(tensor->dtype)));
    }
  }
  // g_idx. With act_order each k's group indexes the scale and zero tensors: one outside [0, groups) would
  // make the kernels read another group's (the group table clamps it) or past the tensors (the gathers).
  // Without it the kernel never reads g_idx (the group of k is k / group_size), so one that is not that
  // would be ignored on the GPU but honoured by the reference.
  if (quant.g_idx && encoding.format == config::WeightFormat::packed_integer) {
    const std::int64_t group = encoding.group_size > 0 ? encoding.group_size : k;
    const std::int64_t groups = io::group_count(encoding, k);  // the scale tensors' rows, checked above
    for (std::int64_t i = 0; i < k; ++i) {
      std::int32_t g;
      std::memcpy(&g, quant.g_idx->bytes.data() + 4 * i, 4);
      if (encoding.act_order && (g < 0 || g >= groups)) {
        throw Error(Stage::input,
                    fmt::format("weights.{}: g_idx[{}] = {} is outside [0, {}), the groups of K = "
                                "{} in groups of {}",
                                name, i, g, groups, k, encoding.group_size));
      }
      if (!encoding.act_order && g != i / group) {
        throw Error(Stage::input, fmt::format("weights.{}: g_idx[{}] = {} is not k / group_size = {}; set "
                                              "/projection/act_order to true for a permuted g_idx",
                                              name, i, g, i / group));
      }
    }
  }
}

}  // namespace

void validate_host_weights(const config::AttentionConfig& config, const io::HostLayerWeights& w) {
  const std::int64_t hidden = config.hidden_size, hq = config.query_heads, hkv = config.kv_heads;
  const std::int64_t d = config.head_dim, dv = config.value_head_dim;
  check_tensor("input_norm", w.input_norm, {hidden}, false);
  check_projection("q_proj", config.projection.qkv, w.q_proj, w.q_quant, hq * d, hidden);
  check_projection("k_proj", config.projection.qkv, w.k_proj, w.k_quant, hkv * d, hidden);
  check_projection("v_proj", config.projection.qkv, w.v_proj, w.v_quant, hkv * dv, hidden);
  check_optional("q_bias", w.q_bias, config.qkv_bias, "qkv_bias", {hq * d});
  check_optional("k_bias", w.k_bias, config.qkv_bias, "qkv_bias", {hkv * d});
  check_optional("v_bias", w.v_bias, config.qkv_bias, "qkv_bias", {hkv * dv});
  check_optional("q_norm", w.q_norm, config.qkv_norm.query, "qkv_norm.query", {d});
  check_optional("k_norm", w.k_norm, config.qkv_norm.key, "qkv_norm.key", {d});
  check_projection("o_proj", config.projection.output, w.o_proj, w.o_quant, hidden, hq * dv);
  check_optional("o_bias", w.o_bias, config.output_bias, "output_bias", {hidden});
  check_optional("sinks", w.sinks, config.sinks, "sinks", {hq});
}

DeviceWeights upload_weights(const config::AttentionConfig& config, const io::HostLayerWeights& w) {
  validate_host_weights(config, w);  // before the first allocation: a bad tensor costs no device memory
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
    const void* zeros;
    const int* g_idx;
  };
  auto hold_projection = [&](const config::WeightEncoding& encoding, const io::HostTensor& weight,
                             const io::QuantizationTensors& quant) -> Quantized {
    if (encoding.format == config::WeightFormat::bf16)
      return {hold(io::to_bf16_bits(weight)), nullptr, nullptr, nullptr, nullptr};
    // packed_integer / affine scales and MLX biases (f16, bf16 or f32 in checkpoints) widen to f32.
    const bool integer = encoding.format == config::WeightFormat::packed_integer;
    const bool f32_scales = encoding.format == config::WeightFormat::fp8 || integer ||
                            encoding.format == config::WeightFormat::affine;
    Quantized held{hold_bytes(weight.bytes), nullptr, nullptr, nullptr, nullptr};
    if (quant.scales) held.scales = f32_scales ? hold_floats(*quant.scales) : hold_bytes(quant.scales->bytes);
    if (quant.scale_2) held.scale_2 = hold_floats(*quant.scale_2);
    if (quant.zeros) held.zeros = integer ? hold_bytes(quant.zeros->bytes) : hold_floats(*quant.zeros);
    if (quant.g_idx) held.g_idx = static_cast<const int*>(hold_bytes(quant.g_idx->bytes));
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
    view.q_zeros = q.zeros;
    view.k_zeros = k.zeros;
    view.v_zeros = v.zeros;
    view.q_g_idx = q.g_idx;
    view.k_g_idx = k.g_idx;
    view.v_g_idx = v.g_idx;
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
  view.o_zeros = o.zeros;
  view.o_g_idx = o.g_idx;
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
