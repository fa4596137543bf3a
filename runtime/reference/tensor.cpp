#include "reference/tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "core/error.hpp"

namespace attnplan::reference {

std::int64_t element_count_of(std::span<const std::int64_t> shape) {
  std::int64_t count = 1;
  for (std::int64_t extent : shape) {
    if (extent < 0)
      throw Error(Stage::input,
                  fmt::format("tensor shape [{}] has a negative extent", fmt::join(shape, ", ")));
    count *= extent;
  }
  return count;
}

Tensor::Tensor(std::vector<std::int64_t> shape_in)
    : shape(std::move(shape_in)), data(static_cast<std::size_t>(element_count_of(shape)), 0.0) {}

Tensor::Tensor(std::vector<std::int64_t> shape_in, std::vector<double> data_in)
    : shape(std::move(shape_in)), data(std::move(data_in)) {
  const std::int64_t expected = element_count_of(shape);
  if (static_cast<std::int64_t>(data.size()) != expected) {
    throw Error(Stage::input, fmt::format("tensor shape [{}] holds {} elements but {} were given",
                                          fmt::join(shape, ", "), expected, data.size()));
  }
}

std::int64_t Tensor::extent(int dim) const {
  if (dim < 0 || dim >= rank()) {
    throw Error(Stage::internal, fmt::format("dimension {} of a rank-{} tensor", dim, rank()));
  }
  return shape[static_cast<std::size_t>(dim)];
}

std::size_t Tensor::offset(std::initializer_list<std::int64_t> indices) const {
  if (indices.size() != shape.size()) {
    throw Error(Stage::internal, fmt::format("{} indices into a rank-{} tensor", indices.size(), rank()));
  }
  std::int64_t flat = 0;
  std::size_t dim = 0;
  for (std::int64_t index : indices) {
    if (index < 0 || index >= shape[dim]) {
      throw Error(Stage::internal, fmt::format("index [{}] is outside tensor shape [{}]",
                                               fmt::join(indices, ", "), fmt::join(shape, ", ")));
    }
    flat = flat * shape[dim] + index;
    ++dim;
  }
  return static_cast<std::size_t>(flat);
}

std::span<double> Tensor::row(std::int64_t row_index) {
  const std::span<const double> view = std::as_const(*this).row(row_index);
  return {data.data() + (view.data() - data.data()), view.size()};
}

std::span<const double> Tensor::row(std::int64_t row_index) const {
  const std::int64_t width = extent(rank() - 1);
  const std::int64_t rows = width == 0 ? 0 : element_count() / width;
  if (row_index < 0 || row_index >= rows) {
    throw Error(Stage::internal, fmt::format("row {} of a tensor with {} rows", row_index, rows));
  }
  return {data.data() + row_index * width, static_cast<std::size_t>(width)};
}

}  // namespace attnplan::reference
