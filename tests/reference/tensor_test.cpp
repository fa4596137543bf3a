#include "reference/tensor.hpp"

#include "support/expect_error.hpp"
#include "support/catch.hpp"

using attnplan::Stage;
using attnplan::reference::Tensor;

TEST_CASE("tensors are row-major and zero-filled", "[reference][tensor]") {
  Tensor tensor({2, 3, 4});
  CHECK(tensor.rank() == 3);
  CHECK(tensor.element_count() == 24);
  CHECK(tensor.extent(2) == 4);
  for (double value : tensor.data) CHECK(value == 0.0);
  tensor(1, 2, 3) = 7.0;
  CHECK(tensor.data[1 * 12 + 2 * 4 + 3] == 7.0);
  CHECK(tensor.offset({1, 0, 1}) == 13);
  CHECK(tensor.row(5).size() == 4);  // row 5 of the [6, 4] view is (1, 2, :)
  CHECK(tensor.row(5)[3] == 7.0);
}

TEST_CASE("tensor misuse is reported", "[reference][tensor]") {
  CHECK(expect_error([] { Tensor({2, 2}, {1.0, 2.0, 3.0}); }).stage() == Stage::input);
  CHECK(expect_error([] { Tensor({2, -1}); }).stage() == Stage::input);
  const Tensor tensor({2, 2}, {1.0, 2.0, 3.0, 4.0});
  CHECK(expect_error([&] { (void)tensor(2, 0); }).stage() == Stage::internal);
  CHECK(expect_error([&] { (void)tensor(0); }).stage() == Stage::internal);
  CHECK(expect_error([&] { (void)tensor.extent(2); }).stage() == Stage::internal);
  CHECK(expect_error([&] { (void)tensor.row(2); }).stage() == Stage::internal);
}

TEST_CASE("a tensor with a zero extent holds nothing", "[reference][tensor]") {
  const Tensor empty({0, 8});
  CHECK(empty.element_count() == 0);
  CHECK(empty.extent(1) == 8);
}
