#include "plan/rope_table.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace attnplan::plan {

namespace {

// llama3: frequencies whose wavelength is short against the original context are kept, long ones are
// divided by the factor, and those between are blended (HF `_compute_llama3_parameters`).
double llama3(double frequency, const config::RopeScaling& s) {
  const double context = static_cast<double>(s.original_max_position);
  const double wavelength = 2.0 * std::numbers::pi / frequency;
  if (wavelength < context / s.high_freq_factor) return frequency;
  if (wavelength > context / s.low_freq_factor) return frequency / s.factor;
  const double smooth = (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * frequency / s.factor + smooth * frequency;
}

// yarn: a linear ramp over pair indices between the dims that complete beta_fast and beta_slow turns in
// the original context; pairs below the ramp keep their frequency, pairs above are interpolated.
struct YarnRamp {
  double low = 0;
  double high = 0;
};

YarnRamp yarn_ramp(int rotary_dim, double theta, const config::RopeScaling& s) {
  const double context = static_cast<double>(s.original_max_position);
  auto dim_of = [&](double turns) {
    return rotary_dim * std::log(context / (2.0 * std::numbers::pi * turns)) / (2.0 * std::log(theta));
  };
  double low = dim_of(s.beta_fast);
  double high = dim_of(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(rotary_dim - 1));
  if (high == low) high += 0.001;
  return {low, high};
}

}  // namespace

RopeTable rope_table(const config::AttentionConfig& config) {
  RopeTable table;
  const int rotary_dim = config.rotary_dim();
  const config::RopeScaling& scaling = config.rotary.scaling;
  const YarnRamp ramp = scaling.type == config::RopeScalingType::yarn
                            ? yarn_ramp(rotary_dim, config.rotary.theta, scaling)
                            : YarnRamp{};
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const double base = std::pow(config.rotary.theta, -2.0 * i / rotary_dim);
    double frequency = base;
    switch (scaling.type) {
      case config::RopeScalingType::none:
        break;
      case config::RopeScalingType::linear:
        frequency = base / scaling.factor;
        break;
      case config::RopeScalingType::llama3:
        frequency = llama3(base, scaling);
        break;
      case config::RopeScalingType::yarn: {
        const double interpolated = std::clamp((i - ramp.low) / (ramp.high - ramp.low), 0.0, 1.0);
        frequency = base / scaling.factor * interpolated + base * (1.0 - interpolated);
        break;
      }
    }
    table.frequencies.push_back(frequency);
  }
  if (scaling.type == config::RopeScalingType::yarn) {
    table.attention_factor =
        scaling.attention_factor.value_or(scaling.factor > 1.0 ? 0.1 * std::log(scaling.factor) + 1.0 : 1.0);
  }
  return table;
}

}  // namespace attnplan::plan
