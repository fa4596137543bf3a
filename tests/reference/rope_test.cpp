// RoPE (spec section 4): which dimensions pair up for each pairing dim, the frequencies of each
// scaling type against the formulas and real model values, and yarn's attention factor.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <utility>
#include <vector>

#include "layer_testing.hpp"
#include "reference/layer.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using attnplan::Stage;
using attnplan::config::AttentionConfig;
using attnplan::config::RopeScalingType;
using attnplan::reference::apply_rope;
using attnplan::reference::rope_attention_factor;
using attnplan::reference::rope_frequencies;
using attnplan::reference::Tensor;

namespace {

// theta 100 and R 4 give f_0 = 1 and f_1 = 100^(-1/2) = 0.1: at position 2 the angles are 2 and 0.2.
constexpr double kTheta = 100.0;
constexpr std::int64_t kPosition = 2;
constexpr double kAngle0 = 2.0;
constexpr double kAngle1 = 0.2;

AttentionConfig rope_config(int head_dim, int rotary_dim, int pairing_dim, int offset = 0) {
  AttentionConfig config = attnplan::reference::testing::small_config(1, 1, head_dim, head_dim);
  config.rotary.theta = kTheta;
  config.rotary.offset = offset;
  config.rotary.dim = rotary_dim;
  config.rotary.pairing_dim = pairing_dim;
  return config;
}

// One token, one head, x = (1, 2, ..., D): each dimension's value says which one it is.
Tensor counting_row(int head_dim) {
  Tensor x({1, 1, head_dim});
  for (int d = 0; d < head_dim; ++d) x(0, 0, d) = d + 1.0;
  return x;
}

Tensor rotated(const AttentionConfig& config, Tensor x, std::int64_t position = kPosition) {
  const std::vector<std::int64_t> positions(static_cast<std::size_t>(x.extent(0)), position);
  apply_rope(x, positions, config);
  return x;
}

// Dimensions a and b of `before` rotated by `angle` into `after`: x'_a = x_a cos - x_b sin, x'_b = x_b cos +
// x_a sin.
void check_pair(const Tensor& before, const Tensor& after, int a, int b, double angle) {
  INFO("pair (" << a << ", " << b << "), angle " << angle);
  const double x_a = before(0, 0, a);
  const double x_b = before(0, 0, b);
  CHECK(after(0, 0, a) == Approx(x_a * std::cos(angle) - x_b * std::sin(angle)).margin(1e-15));
  CHECK(after(0, 0, b) == Approx(x_b * std::cos(angle) + x_a * std::sin(angle)).margin(1e-15));
}

void check_unchanged(const Tensor& before, const Tensor& after, std::vector<int> dims) {
  for (int d : dims) {
    INFO("dimension " << d);
    CHECK(after(0, 0, d) == before(0, 0, d));
  }
}

}  // namespace

TEST_CASE("rope P2 = 2: interleaved pairs (GPT-J, GLM-4)", "[reference][rope]") {
  const Tensor x = counting_row(4);
  const Tensor y = rotated(rope_config(4, 4, 2), x);
  check_pair(x, y, 0, 1, kAngle0);
  check_pair(x, y, 2, 3, kAngle1);
  // By hand for the first pair: (1, 2) at angle 2.
  CHECK(y(0, 0, 0) == Approx(std::cos(2.0) - 2.0 * std::sin(2.0)));  // -2.23474...
  CHECK(y(0, 0, 0) == Approx(-2.2347416901));
}

TEST_CASE("rope P2 = R = D: half split (rotate_half: Llama, Qwen, Gemma)", "[reference][rope]") {
  const Tensor x = counting_row(4);
  const Tensor y = rotated(rope_config(4, 4, 4), x);
  check_pair(x, y, 0, 2, kAngle0);
  check_pair(x, y, 1, 3, kAngle1);
}

TEST_CASE("rope P2 = D > R: pairs across the head, only the first R/2 rotated", "[reference][rope]") {
  // D 8, R 4, P2 8: half 4, pairs (0, 4) and (1, 5); frequencies still use R: f_1 = theta^(-2/4).
  const Tensor x = counting_row(8);
  const Tensor y = rotated(rope_config(8, 4, 8), x);
  check_pair(x, y, 0, 4, kAngle0);
  check_pair(x, y, 1, 5, kAngle1);
  check_unchanged(x, y, {2, 3, 6, 7});
}

TEST_CASE("rope partial rotary P2 = R < D: half split of the first R dims (Phi, Pythia)",
          "[reference][rope]") {
  const Tensor x = counting_row(8);
  const Tensor y = rotated(rope_config(8, 4, 4), x);
  check_pair(x, y, 0, 2, kAngle0);
  check_pair(x, y, 1, 3, kAngle1);
  check_unchanged(x, y, {4, 5, 6, 7});
}

TEST_CASE("rope with an offset: the rope part at the end of the head (MLA-style)", "[reference][rope]") {
  // o 4, R 4, P2 2 in D 8: pairs (4, 5) and (6, 7); the first 4 dims pass through.
  const Tensor x = counting_row(8);
  const Tensor y = rotated(rope_config(8, 4, 2, 4), x);
  check_pair(x, y, 4, 5, kAngle0);
  check_pair(x, y, 6, 7, kAngle1);
  check_unchanged(x, y, {0, 1, 2, 3});
}

TEST_CASE("rope: every head of a token turns alike, by that token's position", "[reference][rope]") {
  const AttentionConfig config = rope_config(4, 4, 2);
  Tensor x({2, 3, 4});
  for (double& value : x.data) value = 1.0;
  const std::vector<std::int64_t> positions{0, 7};
  apply_rope(x, positions, config);
  for (int h = 0; h < 3; ++h) {
    INFO("head " << h);
    // Position 0 is the identity.
    CHECK(x(0, h, 0) == 1.0);
    CHECK(x(0, h, 3) == 1.0);
    // Position 7, pair (0, 1) at angle 7: (cos 7 - sin 7, cos 7 + sin 7).
    CHECK(x(1, h, 0) == Approx(std::cos(7.0) - std::sin(7.0)));
    CHECK(x(1, h, 1) == Approx(std::cos(7.0) + std::sin(7.0)));
  }
}

TEST_CASE("rope dim 0 disables RoPE", "[reference][rope]") {
  const Tensor x = counting_row(4);
  CHECK(rotated(rope_config(4, 0, 2), x).data == x.data);
  CHECK(rope_frequencies(rope_config(4, 0, 2)).empty());
}

TEST_CASE("rope rejects pairs that leave the head and a position count that disagrees", "[reference][rope]") {
  Tensor x = counting_row(4);
  // o 2 + pairs (2, 3), (4, 5): dimension 5 is past D 4.
  CHECK(expect_error([&] { rotated(rope_config(4, 4, 2, 2), x); }).stage() == Stage::config);
  const std::vector<std::int64_t> two_positions{0, 1};
  CHECK(expect_error([&] { apply_rope(x, two_positions, rope_config(4, 4, 2)); }).stage() == Stage::input);
}

TEST_CASE("rope_frequencies without scaling and with linear scaling", "[reference][rope]") {
  AttentionConfig config = rope_config(8, 8, 8);
  config.rotary.theta = 10000.0;
  const std::vector<double> plain = rope_frequencies(config);  // 10000^(-2i/8) = 10^(-i)
  REQUIRE(plain.size() == 4);
  CHECK(plain[0] == 1.0);
  CHECK(plain[1] == Approx(0.1));
  CHECK(plain[2] == Approx(0.01));
  CHECK(plain[3] == Approx(0.001));
  CHECK(rope_attention_factor(config) == 1.0);

  config.rotary.scaling.type = RopeScalingType::linear;
  config.rotary.scaling.factor = 8.0;  // Gemma 3 global layers
  const std::vector<double> linear = rope_frequencies(config);
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(linear[i] == Approx(plain[i] / 8.0));
  CHECK(rope_attention_factor(config) == 1.0);
}

TEST_CASE("rope_frequencies llama3 (Llama-3.1-8B values)", "[reference][rope]") {
  AttentionConfig config = rope_config(128, 128, 128);
  config.rotary.theta = 5e5;
  config.rotary.scaling.type = RopeScalingType::llama3;
  config.rotary.scaling.factor = 8.0;
  config.rotary.scaling.low_freq_factor = 1.0;
  config.rotary.scaling.high_freq_factor = 4.0;
  config.rotary.scaling.original_max_position = 8192;
  const std::vector<double> scaled = rope_frequencies(config);
  REQUIRE(scaled.size() == 64);
  const auto plain = [](int i) { return std::pow(5e5, -2.0 * i / 128.0); };

  // Wavelength 2 pi 5e5^(i/64) is below 8192 / 4 = 2048 up to i = 28 (1956.5): unchanged.
  for (int i : {0, 1, 27, 28}) {
    INFO("high-frequency pair " << i);
    CHECK(scaled[static_cast<std::size_t>(i)] == Approx(plain(i)));
  }
  // Above 8192 / 1 from i = 35 (8218.7): divided by 8.
  for (int i : {35, 36, 63}) {
    INFO("low-frequency pair " << i);
    CHECK(scaled[static_cast<std::size_t>(i)] == Approx(plain(i) / 8.0));
  }
  // In between (i = 29 .. 34) the smooth mix: s = (8192 / l - 1) / (4 - 1).
  for (int i : {29, 31, 34}) {
    INFO("medium-frequency pair " << i);
    const double wavelength = 2.0 * std::numbers::pi / plain(i);
    const double smooth = (8192.0 / wavelength - 1.0) / 3.0;
    CHECK(smooth > 0.0);
    CHECK(smooth < 1.0);
    CHECK(scaled[static_cast<std::size_t>(i)] == Approx((1.0 - smooth) * plain(i) / 8.0 + smooth * plain(i)));
  }
  CHECK(rope_attention_factor(config) == 1.0);
}

TEST_CASE("rope_frequencies yarn (gpt-oss values, truncate false)", "[reference][rope]") {
  AttentionConfig config = rope_config(64, 64, 64);
  config.rotary.theta = 150000.0;
  config.rotary.scaling.type = RopeScalingType::yarn;
  config.rotary.scaling.factor = 32.0;
  config.rotary.scaling.original_max_position = 4096;
  config.rotary.scaling.beta_fast = 32.0;
  config.rotary.scaling.beta_slow = 1.0;
  config.rotary.scaling.truncate = false;
  attnplan::config::resolve_defaults(config);  // fills attention_factor
  const std::vector<double> scaled = rope_frequencies(config);
  REQUIRE(scaled.size() == 32);
  const auto plain = [](int i) { return std::pow(150000.0, -2.0 * i / 64.0); };

  // d(beta) = 64 ln(4096 / (2 pi beta)) / (2 ln 150000): lo = d(32) = 8.0928, hi = d(1) = 17.3980.
  const double low = 64.0 * std::log(4096.0 / (2.0 * std::numbers::pi * 32.0)) / (2.0 * std::log(150000.0));
  const double high = 64.0 * std::log(4096.0 / (2.0 * std::numbers::pi)) / (2.0 * std::log(150000.0));
  CHECK(low == Approx(8.0927791155));
  CHECK(high == Approx(17.3980245016));

  // Pairs up to 8 rotate fast: ramp 0, extrapolated (unchanged). From 18 on: ramp 1, interpolated (/ 32).
  CHECK(scaled[0] == 1.0);
  CHECK(scaled[8] == Approx(plain(8)));
  CHECK(scaled[18] == Approx(plain(18) / 32.0));
  CHECK(scaled[31] == Approx(plain(31) / 32.0));
  // Without truncation the ramp starts at the fractional lo: pair 12 mixes with g = (12 - lo) / (hi - lo).
  const double ramp = (12.0 - low) / (high - low);
  CHECK(scaled[12] == Approx(plain(12) / 32.0 * ramp + plain(12) * (1.0 - ramp)));

  // attention_factor 0.1 ln 32 + 1 (HF get_mscale), the value gpt-oss ships.
  CHECK(rope_attention_factor(config) == Approx(1.3465735903));
}

TEST_CASE("rope_frequencies yarn with truncate: integer ramp ends", "[reference][rope]") {
  AttentionConfig config = rope_config(64, 64, 64);
  config.rotary.theta = 150000.0;
  config.rotary.scaling.type = RopeScalingType::yarn;
  config.rotary.scaling.factor = 32.0;
  config.rotary.scaling.original_max_position = 4096;
  config.rotary.scaling.attention_factor = 1.5;  // an explicit value wins over the default
  const std::vector<double> scaled = rope_frequencies(config);
  const auto plain = [](int i) { return std::pow(150000.0, -2.0 * i / 64.0); };
  // lo = floor(8.09) = 8, hi = ceil(17.40) = 18: pair 13 sits halfway, g = 0.5.
  CHECK(scaled[8] == Approx(plain(8)));
  CHECK(scaled[13] == Approx(plain(13) / 32.0 * 0.5 + plain(13) * 0.5));
  CHECK(scaled[18] == Approx(plain(18) / 32.0));
  CHECK(rope_attention_factor(config) == 1.5);
}

TEST_CASE("rope multiplies cos and sin by yarn's attention factor", "[reference][rope]") {
  AttentionConfig config = rope_config(4, 4, 2);
  config.rotary.scaling.type = RopeScalingType::yarn;
  config.rotary.scaling.factor = 32.0;
  config.rotary.scaling.original_max_position = 4096;
  config.rotary.scaling.attention_factor = 2.0;
  const Tensor x = counting_row(4);
  const Tensor y = rotated(config, x, 0);  // angle 0: cos 1, sin 0, so only the factor shows
  CHECK(y.data == std::vector<double>{2.0, 4.0, 6.0, 8.0});
}

TEST_CASE("rope_frequencies agree with HF transformers' inv_freq", "[reference][rope]") {
  // inv_freq printed by transformers 5.17 ROPE_INIT_FUNCTIONS (float32, hence the 1e-6 tolerance) for
  // Llama-3.1-8B's llama3 scaling and gpt-oss's yarn, at the ends and inside the transition regions.
  AttentionConfig llama = rope_config(128, 128, 128);
  llama.rotary.theta = 5e5;
  llama.rotary.scaling.type = RopeScalingType::llama3;
  llama.rotary.scaling.factor = 8.0;
  llama.rotary.scaling.original_max_position = 8192;
  const std::vector<double> llama_frequencies = rope_frequencies(llama);
  const std::vector<std::pair<int, double>> llama_hf{{0, 1.0},
                                                     {28, 0.0032114461064338684},
                                                     {29, 0.0021665706299245358},
                                                     {31, 0.0008567514596506953},
                                                     {34, 0.0001785077911335975},
                                                     {35, 9.556212171446532e-05},
                                                     {63, 3.068925877869333e-07}};
  for (const auto& [i, expected] : llama_hf) {
    INFO("llama3 pair " << i);
    CHECK(llama_frequencies[static_cast<std::size_t>(i)] == Approx(expected).epsilon(1e-6));
  }

  AttentionConfig gpt_oss = rope_config(64, 64, 64);
  gpt_oss.rotary.theta = 150000.0;
  gpt_oss.rotary.scaling.type = RopeScalingType::yarn;
  gpt_oss.rotary.scaling.factor = 32.0;
  gpt_oss.rotary.scaling.original_max_position = 4096;
  gpt_oss.rotary.scaling.truncate = false;
  const std::vector<double> yarn = rope_frequencies(gpt_oss);
  const std::vector<std::pair<int, double>> yarn_hf{{8, 0.05081327259540558},    {9, 0.031705696135759354},
                                                    {12, 0.006794959306716919},  {17, 0.00012931869423482567},
                                                    {18, 3.830881178146228e-05}, {31, 3.023511396804679e-07}};
  for (const auto& [i, expected] : yarn_hf) {
    INFO("yarn (truncate false) pair " << i);
    CHECK(yarn[static_cast<std::size_t>(i)] == Approx(expected).epsilon(1e-6));
  }

  gpt_oss.rotary.scaling.truncate = true;
  const std::vector<double> truncated = rope_frequencies(gpt_oss);
  const std::vector<std::pair<int, double>> truncated_hf{
      {9, 0.031620752066373825}, {13, 0.0040695546194911}, {17, 0.0002279478358104825}};
  for (const auto& [i, expected] : truncated_hf) {
    INFO("yarn (truncate true) pair " << i);
    CHECK(truncated[static_cast<std::size_t>(i)] == Approx(expected).epsilon(1e-6));
  }
}
