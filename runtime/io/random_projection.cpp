#include "io/random_projection.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/bf16.hpp"
#include "io/float16.hpp"
#include "io/projection_format.hpp"

namespace attnplan::io {
namespace {

using config::Fp8ScaleGranularity;
using config::WeightFormat;

HostTensor empty_tensor(Dtype dtype, std::vector<std::int64_t> shape) {
  HostTensor tensor{dtype, std::move(shape), {}};
  tensor.bytes.resize(tensor.element_count() * element_size(dtype));
  return tensor;
}

template <class Element>
void put(HostTensor& tensor, std::size_t index, Element value) {
  std::memcpy(tensor.bytes.data() + index * sizeof(Element), &value, sizeof(Element));
}

// An e4m3fn byte with magnitude in [2^-3, 2^3): exponent field 4..9, any sign and mantissa, never NaN.
std::uint8_t random_e4m3(std::mt19937_64& rng) {
  const auto bits = static_cast<std::uint32_t>(rng());
  const std::uint32_t exponent = 4 + bits % 6;
  return static_cast<std::uint8_t>(((bits >> 8) & 0x80u) | (exponent << 3) | ((bits >> 16) & 7u));
}

// A positive e4m3fn byte in [0.5, 2): the nvfp4 block scale.
std::uint8_t random_positive_e4m3(std::mt19937_64& rng) {
  const auto bits = static_cast<std::uint32_t>(rng());
  return static_cast<std::uint8_t>(((6 + bits % 2) << 3) | ((bits >> 8) & 7u));
}

// An E8M0 byte 2^e near `target`, one octave either way.
std::uint8_t random_e8m0(std::mt19937_64& rng, double target) {
  const int center = 127 + static_cast<int>(std::lround(std::log2(target)));
  return static_cast<std::uint8_t>(std::clamp(center + static_cast<int>(rng() % 3) - 1, 1, 254));
}

HostTensor random_bytes(Dtype dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  HostTensor tensor = empty_tensor(dtype, std::move(shape));
  for (auto& byte : tensor.bytes) byte = static_cast<std::uint8_t>(rng());
  return tensor;
}

// F32 values uniform in [low, high).
HostTensor random_f32(std::vector<std::int64_t> shape, std::mt19937_64& rng, double low, double high) {
  HostTensor tensor = empty_tensor(Dtype::f32, std::move(shape));
  std::uniform_real_distribution<double> uniform(low, high);
  for (std::size_t i = 0; i < tensor.element_count(); ++i) put(tensor, i, static_cast<float>(uniform(rng)));
  return tensor;
}

HostTensor random_f16(std::vector<std::int64_t> shape, std::mt19937_64& rng, double low, double high,
                      bool random_sign) {
  HostTensor tensor = empty_tensor(Dtype::f16, std::move(shape));
  std::uniform_real_distribution<double> uniform(low, high);
  for (std::size_t i = 0; i < tensor.element_count(); ++i) {
    double value = uniform(rng);
    if (random_sign && rng() % 2 == 0) value = -value;
    put(tensor, i, float_to_f16_normal(static_cast<float>(value)));
  }
  return tensor;
}

}  // namespace

RandomProjection random_projection(const config::WeightEncoding& encoding, std::int64_t n, std::int64_t k,
                                   double magnitude, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto rules = projection_tensor_rules(encoding, "random", n, k);  // checks the shapes
  const auto shape_of = [&](TensorRole role) {
    for (const auto& rule : rules)
      if (rule.role == role) return rule.shapes.front();
    return std::vector<std::int64_t>{};
  };
  RandomProjection out;
  switch (encoding.format) {
    case WeightFormat::bf16: {
      out.weight = empty_tensor(Dtype::bf16, {n, k});
      std::normal_distribution<double> normal(0.0, magnitude);
      for (std::size_t i = 0; i < out.weight.element_count(); ++i)
        put(out.weight, i, core::double_to_bf16(normal(rng)));
      break;
    }
    case WeightFormat::fp8:
    case WeightFormat::mxfp8: {
      out.weight = empty_tensor(Dtype::f8_e4m3, {n, k});
      for (auto& byte : out.weight.bytes) byte = random_e4m3(rng);
      // |e4m3| averages about 2 here.
      if (encoding.format == WeightFormat::mxfp8) {
        out.quant.scales = empty_tensor(Dtype::u8, shape_of(TensorRole::scales));
        for (auto& byte : out.quant.scales->bytes) byte = random_e8m0(rng, magnitude / 2);
      } else {
        out.quant.scales = random_f32(shape_of(TensorRole::scales), rng, magnitude / 4, magnitude * 3 / 4);
      }
      if (encoding.format == WeightFormat::fp8 && encoding.scale_granularity == Fp8ScaleGranularity::tensor)
        out.quant.scales->shape = {};
      break;
    }
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4: {
      out.weight = random_bytes(Dtype::u8, {n, k / 2}, rng);  // every nibble is a valid E2M1; |x| ~ 2
      if (encoding.format == WeightFormat::mxfp4) {
        out.quant.scales = empty_tensor(Dtype::u8, shape_of(TensorRole::scales));
        for (auto& byte : out.quant.scales->bytes) byte = random_e8m0(rng, magnitude / 2);
      } else {
        out.quant.scales = empty_tensor(Dtype::f8_e4m3, shape_of(TensorRole::scales));
        for (auto& byte : out.quant.scales->bytes) byte = random_positive_e4m3(rng);
        out.quant.scale_2 = random_f32({}, rng, magnitude / 2, magnitude / 2 + 1e-9);
      }
      break;
    }
    case WeightFormat::packed_integer: {
      out.weight = random_bytes(Dtype::i32, shape_of(TensorRole::weight), rng);
      out.quant.zeros = random_bytes(Dtype::i32, shape_of(TensorRole::zeros), rng);
      const double step = 2 * magnitude / double(1 << encoding.bits);
      out.quant.scales = random_f16(shape_of(TensorRole::scales), rng, step / 2, step * 3 / 2, false);
      if (encoding.act_order) {
        // The standard assignment k / G, shuffled: each group keeps its size, its rows scatter over K.
        const std::int64_t group = encoding.group_size > 0 ? encoding.group_size : k;
        std::vector<std::int32_t> groups(static_cast<std::size_t>(k));
        for (std::int64_t i = 0; i < k; ++i) groups[std::size_t(i)] = static_cast<std::int32_t>(i / group);
        std::shuffle(groups.begin(), groups.end(), rng);
        out.quant.g_idx = empty_tensor(Dtype::i32, {k});
        std::memcpy(out.quant.g_idx->bytes.data(), groups.data(), groups.size() * 4);
      }
      break;
    }
    case WeightFormat::affine: {
      out.weight = random_bytes(Dtype::u32, shape_of(TensorRole::weight), rng);
      const double levels = double((1 << encoding.bits) - 1);
      const double step = 2 * magnitude / levels;
      out.quant.scales = random_f16(shape_of(TensorRole::scales), rng, step / 2, step * 3 / 2, true);
      // Bias centres each group: b = -s * levels / 2, plus a little.
      out.quant.zeros = empty_tensor(Dtype::f16, shape_of(TensorRole::zeros));
      std::uniform_real_distribution<double> jitter(-magnitude / 4, magnitude / 4);
      for (std::size_t i = 0; i < out.quant.zeros->element_count(); ++i) {
        std::uint16_t scale_bits;
        std::memcpy(&scale_bits, out.quant.scales->bytes.data() + 2 * i, 2);
        const double bias = -f16_to_float(scale_bits) * levels / 2 + jitter(rng);
        put(*out.quant.zeros, i, float_to_f16_normal(static_cast<float>(bias)));
      }
      break;
    }
  }
  return out;
}

}  // namespace attnplan::io
