#include "reference/rmsnorm.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/error.hpp"

namespace attnplan::reference {

Tensor rmsnorm(const Tensor& input, std::span<const double> weight, double epsilon, double weight_offset) {
  if (input.rank() == 0) throw Error(Stage::input, "rmsnorm needs an input of rank 1 or more");
  const std::int64_t width = input.extent(input.rank() - 1);
  if (!weight.empty() && static_cast<std::int64_t>(weight.size()) != width) {
    throw Error(Stage::input, fmt::format("rmsnorm weight has {} elements; the normalized dimension has {}",
                                          weight.size(), width));
  }
  if (!std::isfinite(epsilon) || epsilon < 0.0) {
    throw Error(Stage::input, fmt::format("rmsnorm epsilon is {}; it must be finite and >= 0", epsilon));
  }

  Tensor output(input.shape);
  if (width == 0) return output;
  const std::int64_t rows = input.element_count() / width;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::span<const double> x = input.row(r);
    const std::span<double> y = output.row(r);
    double sum_of_squares = 0.0;
    for (double value : x) sum_of_squares += value * value;
    const double inverse_rms = 1.0 / std::sqrt(sum_of_squares / static_cast<double>(width) + epsilon);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double scale = weight.empty() ? 1.0 : weight[i] + weight_offset;
      y[i] = x[i] * inverse_rms * scale;
    }
  }
  return output;
}

}  // namespace attnplan::reference
