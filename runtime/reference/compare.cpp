#include "reference/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"

namespace attnplan::reference {
namespace {

void require_same_length(std::span<const double> reference, std::span<const double> actual) {
  if (reference.size() != actual.size()) {
    throw Error(Stage::input, fmt::format("comparing {} values against a reference of {}", actual.size(),
                                          reference.size()));
  }
}

constexpr double kInfinity = std::numeric_limits<double>::infinity();

}  // namespace

double relative_l2_error(std::span<const double> reference, std::span<const double> actual) {
  require_same_length(reference, actual);
  double difference_squared = 0.0;
  double reference_squared = 0.0;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    if (!std::isfinite(reference[i]) || !std::isfinite(actual[i])) return kInfinity;
    const double difference = actual[i] - reference[i];
    difference_squared += difference * difference;
    reference_squared += reference[i] * reference[i];
  }
  const double difference_norm = std::sqrt(difference_squared);
  return reference_squared == 0.0 ? difference_norm : difference_norm / std::sqrt(reference_squared);
}

double max_abs_error(std::span<const double> reference, std::span<const double> actual) {
  require_same_length(reference, actual);
  double largest = 0.0;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    if (!std::isfinite(reference[i]) || !std::isfinite(actual[i])) return kInfinity;
    largest = std::max(largest, std::fabs(actual[i] - reference[i]));
  }
  return largest;
}

}  // namespace attnplan::reference
