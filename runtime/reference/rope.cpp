// Spec section 4: RoPE frequencies, their scaling (HF `modeling_rope_utils` rope types), and the
// rotation of dimension pairs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.hpp"
#include "reference/layer.hpp"

namespace attnplan::reference {
namespace {

using config::RopeScaling;
using config::RopeScalingType;

// The rotary dim R, checked for what the formulas below divide by or index with. parse() validates a
// config read from JSON; one built in code (tests) may skip that, so the reference checks again.
int checked_rotary_dim(const config::AttentionConfig& config) {
  const int rotary_dim = config.rotary_dim();
  if (rotary_dim < 0 || rotary_dim % 2 != 0) {
    throw Error(Stage::config,
                fmt::format("rotary dim {} must be even and >= 0 (RoPE rotates pairs)", rotary_dim));
  }
  return rotary_dim;
}

// llama3: frequencies whose wavelength fits many times in the original context keep their value, those
// longer than the context are interpolated by `factor`, and a smooth mix in between.
double llama3_frequency(double frequency, const RopeScaling& scaling) {
  const double original = static_cast<double>(scaling.original_max_position);
  const double wavelength = 2.0 * std::numbers::pi / frequency;
  if (wavelength < original / scaling.high_freq_factor) return frequency;
  if (wavelength > original / scaling.low_freq_factor) return frequency / scaling.factor;
  const double smooth = (original / wavelength - scaling.low_freq_factor) /
                        (scaling.high_freq_factor - scaling.low_freq_factor);
  return (1.0 - smooth) * frequency / scaling.factor + smooth * frequency;
}

// yarn: the pair index below which a frequency completes more than `beta` rotations over the original
// context, d(beta) = R ln(L / (2 pi beta)) / (2 ln theta) (HF find_correction_dim).
double yarn_correction_dim(double beta, int rotary_dim, double theta, const RopeScaling& scaling) {
  const double original = static_cast<double>(scaling.original_max_position);
  return rotary_dim * std::log(original / (2.0 * std::numbers::pi * beta)) / (2.0 * std::log(theta));
}

void apply_yarn(std::vector<double>& frequencies, int rotary_dim, double theta, const RopeScaling& scaling) {
  double low = yarn_correction_dim(scaling.beta_fast, rotary_dim, theta, scaling);
  double high = yarn_correction_dim(scaling.beta_slow, rotary_dim, theta, scaling);
  if (scaling.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  // The spec clamps both ends to [0, R - 1]. HF clamps only low from below and high from above
  // (max(low, 0), min(high, R - 1)); the two agree whenever d(beta_fast) <= R - 1 and d(beta_slow) >= 0,
  // which holds for every real config (beta_fast > beta_slow makes low <= high).
  const double last = static_cast<double>(rotary_dim - 1);
  low = std::clamp(low, 0.0, last);
  high = std::clamp(high, 0.0, last);
  if (high == low) high += 0.001;  // HF linear_ramp_factor: keeps the ramp a step instead of 0 / 0

  // g_i = 0 (fast rotating, low i): keep f_i (extrapolation); g_i = 1 (slow, high i): f_i / factor
  // (interpolation). HF writes the same thing through inv_freq_extrapolation_factor = 1 - g_i:
  //   inv_freq = interpolation * (1 - (1 - g_i)) + extrapolation * (1 - g_i)
  // which is the spec's f = f_i / factor * g_i + f_i * (1 - g_i).
  for (std::size_t i = 0; i < frequencies.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double frequency = frequencies[i];
    frequencies[i] = frequency / scaling.factor * ramp + frequency * (1.0 - ramp);
  }
}

}  // namespace

std::vector<double> rope_frequencies(const config::AttentionConfig& config) {
  const int rotary_dim = checked_rotary_dim(config);
  const double theta = config.rotary.theta;
  std::vector<double> frequencies(static_cast<std::size_t>(rotary_dim / 2));
  // f_i = theta^(-2i/R): R is the rotary dim, not head_dim (partial rotary uses its own R, as in HF).
  for (std::size_t i = 0; i < frequencies.size(); ++i) {
    frequencies[i] = std::pow(theta, -2.0 * static_cast<double>(i) / rotary_dim);
  }

  const RopeScaling& scaling = config.rotary.scaling;
  switch (scaling.type) {
    case RopeScalingType::none:
      break;
    case RopeScalingType::linear:
      for (double& frequency : frequencies) frequency /= scaling.factor;
      break;
    case RopeScalingType::llama3:
      for (double& frequency : frequencies) frequency = llama3_frequency(frequency, scaling);
      break;
    case RopeScalingType::yarn:
      apply_yarn(frequencies, rotary_dim, theta, scaling);
      break;
  }
  return frequencies;
}

double rope_attention_factor(const config::AttentionConfig& config) {
  const RopeScaling& scaling = config.rotary.scaling;
  if (scaling.type != RopeScalingType::yarn) return 1.0;
  // parse()/resolve_defaults() fill it; the fallback is the same default for a config that skipped them.
  return scaling.attention_factor.value_or(scaling.factor <= 1.0 ? 1.0
                                                                 : 0.1 * std::log(scaling.factor) + 1.0);
}

void apply_rope(Tensor& x, std::span<const std::int64_t> positions, const config::AttentionConfig& config) {
  if (x.rank() != 3) {
    throw Error(Stage::input, fmt::format("apply_rope: x must be [tokens, heads, head_dim], got [{}]",
                                          fmt::join(x.shape, ", ")));
  }
  const std::int64_t tokens = x.extent(0);
  const std::int64_t heads = x.extent(1);
  const std::int64_t head_dim = x.extent(2);
  if (static_cast<std::int64_t>(positions.size()) != tokens) {
    throw Error(Stage::input,
                fmt::format("apply_rope: {} positions for {} tokens", positions.size(), tokens));
  }
  const int rotary_dim = checked_rotary_dim(config);
  if (rotary_dim == 0) return;  // RoPE disabled
  const int offset = config.rotary.offset;
  const int pairing_dim = config.pairing_dim();
  if (pairing_dim < 2 || pairing_dim % 2 != 0 ||
      (pairing_dim <= rotary_dim && rotary_dim % pairing_dim != 0)) {
    throw Error(Stage::config, fmt::format("pairing dim {} must be even, >= 2, and divide rotary dim {} when "
                                           "not larger",
                                           pairing_dim, rotary_dim));
  }

  // Pair i rotates dimensions (a_i, b_i) = (a_i, a_i + half); both grow with i, so checking the last pair
  // bounds them all.
  const int half = pairing_dim / 2;
  const int num_pairs = rotary_dim / 2;
  auto first_of_pair = [&](int pair) {
    return static_cast<std::int64_t>(offset) + static_cast<std::int64_t>(pairing_dim) * (pair / half) +
           pair % half;
  };
  if (offset < 0 || first_of_pair(num_pairs - 1) + half >= head_dim) {
    throw Error(Stage::config,
                fmt::format("rotary offset {}, dim {}, pairing dim {} pair dimension {} past head_dim {}",
                            offset, rotary_dim, pairing_dim, first_of_pair(num_pairs - 1) + half, head_dim));
  }

  const std::vector<double> frequencies = rope_frequencies(config);
  const double attention_factor = rope_attention_factor(config);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const double position = static_cast<double>(positions[static_cast<std::size_t>(t)]);
    for (int pair = 0; pair < num_pairs; ++pair) {
      // yarn's attention_factor scales cos and sin, i.e. the whole rotated pair (HF multiplies the
      // cos/sin caches by it), so q.k of rotated dims grows by its square.
      const double angle = position * frequencies[static_cast<std::size_t>(pair)];
      const double cos_value = std::cos(angle) * attention_factor;
      const double sin_value = std::sin(angle) * attention_factor;
      const std::int64_t a = first_of_pair(pair);
      const std::int64_t b = a + half;
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::span<double> row = x.row(t * heads + h);  // [head_dim]
        const double x_a = row[static_cast<std::size_t>(a)];
        const double x_b = row[static_cast<std::size_t>(b)];
        row[static_cast<std::size_t>(a)] = x_a * cos_value - x_b * sin_value;
        row[static_cast<std::size_t>(b)] = x_b * cos_value + x_a * sin_value;
      }
    }
  }
}

}  // namespace attnplan::reference
