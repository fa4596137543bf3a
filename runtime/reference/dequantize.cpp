#include "reference/dequantize.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/error.hpp"
#include "io/projection_format.hpp"

namespace attnplan::reference {
namespace {

using config::Fp8ScaleGranularity;
using config::PackedIntegerScheme;
using config::WeightFormat;

template <class Element>
Element element(const io::HostTensor& tensor, std::int64_t index) {
  Element value;
  std::memcpy(&value, tensor.bytes.data() + static_cast<std::size_t>(index) * sizeof(Element),
              sizeof(Element));
  return value;
}

// The tensor of a role, checked to hold `count` elements of `element_bytes` (the format's unit).
const io::HostTensor& require(const std::optional<io::HostTensor>& tensor, std::string_view role,
                              const config::WeightEncoding& encoding) {
  if (!tensor) {
    throw Error(Stage::input, fmt::format("dequantize: {} weights need their {} tensor",
                                          config::to_string(encoding.format), role));
  }
  return *tensor;
}

void require_bytes(const io::HostTensor& tensor, std::string_view role, std::uint64_t bytes) {
  if (tensor.bytes.size() != bytes) {
    throw Error(Stage::input, fmt::format("dequantize: the {} tensor has {} bytes, the format needs {}", role,
                                          tensor.bytes.size(), bytes));
  }
}

}  // namespace

double e8m0_value(std::uint8_t e) {
  if (e == 0xFF) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, int{e} - 127);
}

double e2m1_value(std::uint8_t nibble) {
  static constexpr double kMagnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  const double magnitude = kMagnitude[nibble & 7u];
  return (nibble & 8u) != 0 ? -magnitude : magnitude;
}

double e4m3fn_value(std::uint8_t byte) {
  const int exponent = (byte >> 3) & 15, mantissa = byte & 7;
  const double sign = (byte & 0x80u) != 0 ? -1.0 : 1.0;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa / 8.0, -6);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
}

std::uint32_t stream_bits(std::span<const std::uint8_t> stream, std::int64_t index, int bits) {
  std::uint32_t value = 0;
  const std::int64_t first = index * bits;
  for (int b = 0; b < bits; ++b) {
    const std::int64_t position = first + b;
    const std::uint32_t bit = (stream[static_cast<std::size_t>(position / 8)] >> (position % 8)) & 1u;
    value |= bit << b;
  }
  return value;
}

Tensor dequantize(const config::WeightEncoding& encoding, const io::HostTensor& weight,
                  const io::QuantizationTensors& quant, std::int64_t n, std::int64_t k) {
  Tensor out({n, k});
  const auto at = [&](std::int64_t row, std::int64_t column) -> double& {
    return out.data[static_cast<std::size_t>(row * k + column)];
  };
  const auto nk = static_cast<std::uint64_t>(n * k);
  switch (encoding.format) {
    case WeightFormat::bf16: {
      require_bytes(weight, "weight", nk * 2);
      const auto values = io::to_doubles(weight);
      std::copy(values.begin(), values.end(), out.data.begin());
      break;
    }
    case WeightFormat::fp8: {
      require_bytes(weight, "weight", nk);
      const auto& scales = require(quant.scales, "weight_scale", encoding);
      const auto scale = io::to_doubles(scales);
      const std::int64_t block_columns = (k + 127) / 128;
      for (std::int64_t row = 0; row < n; ++row) {
        for (std::int64_t column = 0; column < k; ++column) {
          double s = scale.at(0);
          if (encoding.scale_granularity == Fp8ScaleGranularity::channel) s = scale.at(std::size_t(row));
          if (encoding.scale_granularity == Fp8ScaleGranularity::block)
            s = scale.at(std::size_t((row / 128) * block_columns + column / 128));
          at(row, column) = e4m3fn_value(weight.bytes[std::size_t(row * k + column)]) * s;
        }
      }
      break;
    }
    case WeightFormat::mxfp8:
    case WeightFormat::mxfp4: {
      const bool fp4 = encoding.format == WeightFormat::mxfp4;
      require_bytes(weight, "weight", fp4 ? nk / 2 : nk);
      const auto& scales = require(quant.scales, "weight_scale", encoding);
      require_bytes(scales, "weight_scale", nk / 32);
      for (std::int64_t row = 0; row < n; ++row) {
        for (std::int64_t column = 0; column < k; ++column) {
          const double s = e8m0_value(scales.bytes[std::size_t(row * (k / 32) + column / 32)]);
          double q;
          if (fp4) {
            const std::uint8_t byte = weight.bytes[std::size_t(row * (k / 2) + column / 2)];
            q = e2m1_value(column % 2 == 0 ? byte & 15u : byte >> 4);  // low nibble = even k
          } else {
            q = e4m3fn_value(weight.bytes[std::size_t(row * k + column)]);
          }
          at(row, column) = q * s;
        }
      }
      break;
    }
    case WeightFormat::nvfp4: {
      require_bytes(weight, "weight", nk / 2);
      const auto& scales = require(quant.scales, "weight_scale", encoding);
      require_bytes(scales, "weight_scale", nk / 16);
      const double scale_2 = io::to_doubles(require(quant.scale_2, "weight_scale_2", encoding)).at(0);
      for (std::int64_t row = 0; row < n; ++row) {
        for (std::int64_t column = 0; column < k; ++column) {
          const std::uint8_t byte = weight.bytes[std::size_t(row * (k / 2) + column / 2)];
          const double s = e4m3fn_value(scales.bytes[std::size_t(row * (k / 16) + column / 16)]);
          at(row, column) = e2m1_value(column % 2 == 0 ? byte & 15u : byte >> 4) * s * scale_2;
        }
      }
      break;
    }
    case WeightFormat::packed_integer: {
      const int bits = encoding.bits;
      const std::int64_t per_word = io::values_per_word(encoding);
      const std::uint32_t mask = (1u << bits) - 1u;
      const std::int64_t group = encoding.group_size > 0 ? encoding.group_size : k;
      const std::int64_t groups = k / group;
      const bool awq = encoding.scheme == PackedIntegerScheme::awq;
      require_bytes(weight, "qweight", nk * std::uint64_t(bits) / 8);
      const auto& zeros = require(quant.zeros, "qzeros", encoding);
      require_bytes(zeros, "qzeros", std::uint64_t(groups * n) * std::uint64_t(bits) / 8);
      const auto scales = io::to_doubles(require(quant.scales, "scales", encoding));  // [groups, N]
      if (scales.size() != std::size_t(groups * n)) {
        throw Error(Stage::input, fmt::format("dequantize: scales hold {} values, the format needs {}",
                                              scales.size(), groups * n));
      }
      if (quant.g_idx) require_bytes(*quant.g_idx, "g_idx", std::uint64_t(k) * 4);
      // AWQ: nibble i of a word holds column 8c + order[i], order = {0, 2, 4, 6, 1, 3, 5, 7}; this is the
      // inverse, the nibble of column offset j.
      static constexpr int kAwqNibbleOfColumn[8] = {0, 4, 1, 5, 2, 6, 3, 7};
      const auto packed_along_n = [&](const io::HostTensor& tensor, std::int64_t row, std::int64_t column) {
        const auto word = element<std::uint32_t>(tensor, row * (n / per_word) + column / per_word);
        const int slot = awq ? kAwqNibbleOfColumn[column % 8] : int(column % per_word);
        return (word >> (bits * slot)) & mask;
      };
      for (std::int64_t column_k = 0; column_k < k; ++column_k) {
        std::int64_t g = column_k / group;
        if (quant.g_idx) g = element<std::int32_t>(*quant.g_idx, column_k);
        if (g < 0 || g >= groups) {
          throw Error(Stage::input,
                      fmt::format("dequantize: g_idx[{}] = {} is outside [0, {})", column_k, g, groups));
        }
        for (std::int64_t row = 0; row < n; ++row) {
          std::uint32_t q;
          if (awq) {
            q = packed_along_n(weight, column_k, row);  // qweight [K, N / 8]
          } else {
            const auto word = element<std::uint32_t>(weight, (column_k / per_word) * n + row);  // [K / P, N]
            q = (word >> (bits * (column_k % per_word))) & mask;
          }
          const double z = packed_along_n(zeros, g, row);
          const double s = scales[std::size_t(g * n + row)];
          const double zero = encoding.scheme == PackedIntegerScheme::gptq ? z + 1 : z;
          at(row, column_k) = s * (double(q) - zero);
        }
      }
      break;
    }
    case WeightFormat::affine: {
      const int bits = encoding.bits;
      const std::int64_t group = encoding.group_size;
      const std::int64_t row_bytes = k * bits / 8;
      require_bytes(weight, "weight", std::uint64_t(n * row_bytes));
      const auto scales = io::to_doubles(require(quant.scales, "scales", encoding));  // [N, K / G]
      const auto biases = io::to_doubles(require(quant.zeros, "biases", encoding));
      if (scales.size() != std::size_t(n * (k / group)) || biases.size() != scales.size()) {
        throw Error(Stage::input,
                    fmt::format("dequantize: scales/biases hold {}/{} values, the format needs {}",
                                scales.size(), biases.size(), n * (k / group)));
      }
      for (std::int64_t row = 0; row < n; ++row) {
        const std::span<const std::uint8_t> stream(weight.bytes.data() + row * row_bytes,
                                                   std::size_t(row_bytes));
        for (std::int64_t column = 0; column < k; ++column) {
          const std::size_t g = std::size_t(row * (k / group) + column / group);
          at(row, column) = scales[g] * double(stream_bits(stream, column, bits)) + biases[g];
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace attnplan::reference
