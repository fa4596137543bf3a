#include "reference/fp8_activation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/fp8.hpp"

namespace attnplan::reference {

namespace {
constexpr int kGroup = 128;  // channels per scale of token_group (kFp8ActivationGroup)
}

Fp8Activations quantize_activations_fp8(std::span<const std::uint16_t> bits, int m, int k,
                                        config::Fp8ActivationScales scales) {
  if (m < 0 || k < 0 || bits.size() != std::size_t(m) * std::size_t(k)) {
    throw Error(Stage::input,
                fmt::format("quantize_activations_fp8: {} values for [m = {}, k = {}]", bits.size(), m, k));
  }
  // One group of the whole row per token (at least 1 channel wide, so that K = 0 has no group).
  const int group_width = scales == config::Fp8ActivationScales::token ? std::max(k, 1) : kGroup;
  const int groups = (k + group_width - 1) / group_width;
  Fp8Activations result;
  result.m = m;
  result.k = k;
  result.group = group_width;
  result.codes.resize(bits.size());
  result.scales.resize(std::size_t(groups) * std::size_t(m));
  for (int row = 0; row < m; ++row) {
    for (int group = 0; group < groups; ++group) {
      const int begin = group * group_width;
      const int end = std::min(k, begin + group_width);
      float amax = 0.0f;
      for (int c = begin; c < end; ++c) {
        amax = std::max(amax, std::fabs(core::bf16_to_float(bits[std::size_t(row) * k + c])));
      }
      // fp32 divisions, one IEEE rounding each: the kernel's __fdiv_rn.
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      result.scales[std::size_t(group) * m + row] = scale;
      for (int c = begin; c < end; ++c) {
        const std::size_t index = std::size_t(row) * k + c;
        result.codes[index] = core::float_to_fp8_e4m3(core::bf16_to_float(bits[index]) / scale);
      }
    }
  }
  return result;
}

Tensor dequantize_activations_fp8(const Fp8Activations& activations) {
  Tensor a({activations.m, activations.k});
  for (int row = 0; row < activations.m; ++row) {
    for (int c = 0; c < activations.k; ++c) {
      const std::size_t index = std::size_t(row) * activations.k + c;
      a.data[index] = core::fp8_e4m3_to_double(activations.codes[index]) *
                      double(activations.scales[std::size_t(c / activations.group) * activations.m + row]);
    }
  }
  return a;
}

}  // namespace attnplan::reference
