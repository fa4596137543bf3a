#include "reference/compare.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "support/expect_error.hpp"
#include "support/catch.hpp"

using attnplan::reference::max_abs_error;
using attnplan::reference::relative_l2_error;

TEST_CASE("relative L2 error by hand", "[reference][compare]") {
  const std::vector<double> reference{3.0, 4.0};
  CHECK(relative_l2_error(reference, reference) == 0.0);
  CHECK(relative_l2_error(reference, std::vector<double>{3.0, 5.0}) == Approx(0.2));  // |(0,1)| / |(3,4)|
  CHECK(relative_l2_error(reference, std::vector<double>{0.0, 0.0}) == Approx(1.0));
  CHECK(max_abs_error(reference, std::vector<double>{2.5, 5.0}) == 1.0);
}

TEST_CASE("a zero reference gives the absolute error", "[reference][compare]") {
  const std::vector<double> zeros{0.0, 0.0};
  CHECK(relative_l2_error(zeros, zeros) == 0.0);
  CHECK(relative_l2_error(zeros, std::vector<double>{3.0, 4.0}) == Approx(5.0));
  CHECK(relative_l2_error(std::vector<double>{}, std::vector<double>{}) == 0.0);
}

TEST_CASE("non-finite values make the error infinite", "[reference][compare]") {
  const std::vector<double> reference{1.0, 2.0};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(std::isinf(relative_l2_error(reference, std::vector<double>{1.0, nan})));
  CHECK(std::isinf(relative_l2_error(reference, std::vector<double>{1.0, -INFINITY})));
  CHECK(std::isinf(max_abs_error(reference, std::vector<double>{nan, 2.0})));
}

TEST_CASE("comparing different lengths is an input error", "[reference][compare]") {
  const std::vector<double> two{1.0, 2.0};
  const std::vector<double> three{1.0, 2.0, 3.0};
  CHECK(expect_error([&] { relative_l2_error(two, three); }).stage() == attnplan::Stage::input);
  CHECK(expect_error([&] { max_abs_error(three, two); }).stage() == attnplan::Stage::input);
}
