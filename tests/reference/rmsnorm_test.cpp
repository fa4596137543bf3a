// RMSNorm against values worked out by hand (spec sections 1 and 3).
#include "reference/rmsnorm.hpp"

#include <cmath>
#include <vector>

#include "support/expect_error.hpp"
#include "support/catch.hpp"

using attnplan::Stage;
using attnplan::reference::rmsnorm;
using attnplan::reference::Tensor;

TEST_CASE("rmsnorm of one row with a plain weight", "[reference][rmsnorm]") {
  // mean(1, 4, 9, 16) = 7.5; + eps 0.5 = 8; 1 / sqrt(8) = 0.35355339...
  const Tensor input({1, 4}, {1.0, 2.0, 3.0, 4.0});
  const std::vector<double> weight{1.0, 0.5, 2.0, 0.0};
  const Tensor output = rmsnorm(input, weight, 0.5);
  const double inverse_rms = 1.0 / std::sqrt(8.0);
  CHECK(output.shape == input.shape);
  CHECK(output(0, 0) == Approx(1.0 * inverse_rms * 1.0));  // 0.353553
  CHECK(output(0, 1) == Approx(2.0 * inverse_rms * 0.5));  // 0.353553
  CHECK(output(0, 2) == Approx(3.0 * inverse_rms * 2.0));  // 2.121320
  CHECK(output(0, 3) == 0.0);
  CHECK(output(0, 2) == Approx(2.1213203436));
}

TEST_CASE("rmsnorm with weight_offset 1 scales by 1 + w (Gemma)", "[reference][rmsnorm]") {
  const Tensor input({1, 4}, {1.0, 2.0, 3.0, 4.0});
  const std::vector<double> weight{1.0, 0.5, 2.0, 0.0};
  const Tensor output = rmsnorm(input, weight, 0.5, 1.0);
  CHECK(output(0, 0) == Approx(0.7071067812));  // 1 * 0.353553 * 2
  CHECK(output(0, 1) == Approx(1.0606601718));  // 2 * 0.353553 * 1.5
  CHECK(output(0, 2) == Approx(3.1819805153));  // 3 * 0.353553 * 3
  CHECK(output(0, 3) == Approx(1.4142135624));  // 4 * 0.353553 * 1: a zero weight still passes the value

  // A zero Gemma weight is the plain normalization: (3, 4) / sqrt(12.5).
  const Tensor plain = rmsnorm(Tensor({1, 2}, {3.0, 4.0}), std::vector<double>{0.0, 0.0}, 0.0, 1.0);
  CHECK(plain(0, 0) == Approx(0.8485281374));
  CHECK(plain(0, 1) == Approx(1.1313708499));
}

TEST_CASE("rows are normalized independently", "[reference][rmsnorm]") {
  // Row 0: (2, -2) has rms 2 -> (1, -1). Row 1: (0, 0) with eps 0.25 stays 0. Row 2: (6, 8) has
  // mean square 50, + 0.25 -> 1 / sqrt(50.25).
  const Tensor input({3, 2}, {2.0, -2.0, 0.0, 0.0, 6.0, 8.0});
  const std::vector<double> weight{1.0, 3.0};
  const Tensor output = rmsnorm(input, weight, 0.25);
  const double first = 1.0 / std::sqrt(4.25);
  CHECK(output(0, 0) == Approx(2.0 * first));
  CHECK(output(0, 1) == Approx(-2.0 * first * 3.0));
  CHECK(output(1, 0) == 0.0);
  CHECK(output(1, 1) == 0.0);
  CHECK(output(2, 0) == Approx(6.0 / std::sqrt(50.25)));
  CHECK(output(2, 1) == Approx(24.0 / std::sqrt(50.25)));
}

TEST_CASE("per-head norms share one weight across heads", "[reference][rmsnorm]") {
  // [tokens 1, heads 2, head_dim 2]; each head normalized over its own 2 values.
  const Tensor input({1, 2, 2}, {1.0, 1.0, 3.0, 4.0});
  const std::vector<double> weight{2.0, 1.0};
  const Tensor output = rmsnorm(input, weight, 0.0);
  CHECK(output(0, 0, 0) == Approx(2.0));  // (1, 1) has rms 1
  CHECK(output(0, 0, 1) == Approx(1.0));
  CHECK(output(0, 1, 0) == Approx(2.0 * 3.0 / std::sqrt(12.5)));
  CHECK(output(0, 1, 1) == Approx(4.0 / std::sqrt(12.5)));
}

TEST_CASE("a norm without weight only normalizes (the v norm)", "[reference][rmsnorm]") {
  const Tensor output = rmsnorm(Tensor({1, 2}, {3.0, 4.0}), {}, 0.0, 1.0);
  CHECK(output(0, 0) == Approx(3.0 / std::sqrt(12.5)));
  CHECK(output(0, 1) == Approx(4.0 / std::sqrt(12.5)));
}

TEST_CASE("epsilon is added to the mean square, not to the rms", "[reference][rmsnorm]") {
  // mean(1) = 1; eps 3 -> 1 / sqrt(4) = 0.5 (adding it to the rms would give 1 / 4).
  const Tensor output = rmsnorm(Tensor({1, 1}, {1.0}), std::vector<double>{1.0}, 3.0);
  CHECK(output(0, 0) == Approx(0.5));
}

TEST_CASE("rmsnorm argument errors", "[reference][rmsnorm]") {
  const Tensor input({2, 3});
  CHECK(expect_error([&] { rmsnorm(input, std::vector<double>{1.0, 1.0}, 1e-6); }).stage() == Stage::input);
  CHECK(expect_error([&] {
          rmsnorm(input, std::vector<double>{1.0, 1.0, 1.0}, -1.0);
        }).stage() == Stage::input);
  CHECK(expect_error([&] {
          rmsnorm(input, std::vector<double>{1.0, 1.0, 1.0}, NAN);
        }).stage() == Stage::input);
  CHECK(expect_error([&] { rmsnorm(Tensor{}, {}, 1e-6); }).stage() == Stage::input);
}
