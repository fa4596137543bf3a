// The CPU reference's one data type: a dense row-major array of doubles with its shape. Deliberately
// plain (public members, no views or strides) so that every reference function reads like the spec.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

namespace attnplan::reference {

struct Tensor {
  std::vector<std::int64_t> shape;  // outermost first, e.g. [tokens, heads, dim]
  std::vector<double> data;         // element count == product of shape

  Tensor() = default;
  // Zero-filled. Throws Error(input) for a negative extent.
  explicit Tensor(std::vector<std::int64_t> shape_in);
  // Takes `data_in` as is. Throws Error(input) when its size does not match the shape.
  Tensor(std::vector<std::int64_t> shape_in, std::vector<double> data_in);

  int rank() const noexcept { return static_cast<int>(shape.size()); }
  std::int64_t extent(int dim) const;  // shape[dim]; Error(internal) if dim is outside the rank
  std::int64_t element_count() const noexcept { return static_cast<std::int64_t>(data.size()); }

  // Element (i0, i1, ...), bounds-checked (Error(internal)): reference code indexes exactly as the spec.
  template <class... Index>
  double& operator()(Index... indices) {
    return data[offset({static_cast<std::int64_t>(indices)...})];
  }
  template <class... Index>
  const double& operator()(Index... indices) const {
    return data[offset({static_cast<std::int64_t>(indices)...})];
  }
  // Row-major offset of a full index.
  std::size_t offset(std::initializer_list<std::int64_t> indices) const;

  // The last dimension's elements at the given outer offset, i.e. row `row` of the [element_count / n, n]
  // view where n is the last extent.
  std::span<double> row(std::int64_t row_index);
  std::span<const double> row(std::int64_t row_index) const;
};

// Product of `shape`'s extents; Error(input) for a negative one.
std::int64_t element_count_of(std::span<const std::int64_t> shape);

}  // namespace attnplan::reference
