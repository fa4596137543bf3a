// Size arithmetic on untrusted shapes (file headers, user tensors): every product is checked, so a shape
// that claims more than 2^64 elements or bytes is reported instead of wrapping around to a small number.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>

namespace attnplan::io {

// a * b, or nullopt when it does not fit in 64 bits.
inline std::optional<std::uint64_t> checked_multiply(std::uint64_t a, std::uint64_t b) noexcept {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

// The element count of a shape ([] is a scalar: 1), or nullopt for a negative extent or an overflow.
// An extent of 0 makes the count 0 whatever the others are, as the data would be empty.
inline std::optional<std::uint64_t> checked_product(std::span<const std::int64_t> shape) noexcept {
  for (const std::int64_t extent : shape) {
    if (extent < 0) return std::nullopt;
  }
  for (const std::int64_t extent : shape) {
    if (extent == 0) return 0;
  }
  std::uint64_t count = 1;
  for (const std::int64_t extent : shape) {
    const auto next = checked_multiply(count, static_cast<std::uint64_t>(extent));
    if (!next) return std::nullopt;
    count = *next;
  }
  return count;
}

}  // namespace attnplan::io
