// linear(): x W^T + b with HF's [out, in] weights (spec sections 2 and 7), checked by hand.
#include <vector>

#include "reference/layer.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using attnplan::Stage;
using attnplan::reference::linear;
using attnplan::reference::Tensor;

TEST_CASE("linear on a 2x3 input: x W^T + b", "[reference][linear]") {
  const Tensor x({2, 3}, {1.0, 2.0, 3.0,  //
                          4.0, 5.0, 6.0});
  // [out = 2, in = 3]: output 0 is x0 - x2, output 1 is 0.5 x0 + 2 x1 + x2.
  const Tensor weight({2, 3}, {1.0, 0.0, -1.0,  //
                               0.5, 2.0, 1.0});
  const std::vector<double> bias{10.0, -1.0};

  const Tensor with_bias = linear(x, weight, bias);
  CHECK(with_bias.shape == std::vector<std::int64_t>{2, 2});
  CHECK(with_bias.data == std::vector<double>{8.0, 6.5, 8.0, 17.0});  // small integers: exact

  const Tensor without_bias = linear(x, weight, {});
  CHECK(without_bias.data == std::vector<double>{-2.0, 7.5, -2.0, 18.0});
}

TEST_CASE("linear keeps x's leading dimensions", "[reference][linear]") {
  // [2, 1, 3] is two rows of 3; the attention output [T, Hq, Dv] can go to o_proj as is.
  const Tensor x({2, 1, 3}, {1.0, 2.0, 3.0, 4.0, 5.0, 6.0});
  const Tensor weight({1, 3}, {1.0, 1.0, 1.0});
  const Tensor y = linear(x, weight, {});
  CHECK(y.shape == std::vector<std::int64_t>{2, 1, 1});
  CHECK(y.data == std::vector<double>{6.0, 15.0});
}

TEST_CASE("linear rejects shapes that disagree", "[reference][linear]") {
  const Tensor x({2, 3});
  CHECK(expect_error([&] { linear(x, Tensor({2, 4}), {}); }).stage() == Stage::input);
  CHECK(expect_error([&] { linear(x, Tensor({3}), {}); }).stage() == Stage::input);
  const std::vector<double> wrong_bias{1.0, 2.0, 3.0};
  const attnplan::Error error = expect_error([&] { linear(x, Tensor({2, 3}), wrong_bias); });
  CHECK(contains(error.message(), "bias has 3 elements"));
}

TEST_CASE("linear on many rows matches the plain sum over k", "[reference][linear]") {
  // 37 rows cross the row tiles and groups linear() works in; each output must still be the plain
  // left-to-right sum, bit for bit.
  Tensor x({37, 5});
  Tensor weight({3, 5});
  for (std::size_t i = 0; i < x.data.size(); ++i) x.data[i] = 0.1 * static_cast<double>(i % 11) - 0.3;
  for (std::size_t i = 0; i < weight.data.size(); ++i) weight.data[i] = 0.7 - 0.05 * static_cast<double>(i);
  const std::vector<double> bias{0.25, -0.5, 1.0};
  const Tensor y = linear(x, weight, bias);
  for (std::int64_t m = 0; m < 37; ++m) {
    for (std::int64_t n = 0; n < 3; ++n) {
      double sum = 0.0;
      for (std::int64_t k = 0; k < 5; ++k) sum += x(m, k) * weight(n, k);
      INFO("row " << m << ", output " << n);
      CHECK(y(m, n) == sum + bias[static_cast<std::size_t>(n)]);
    }
  }
}
