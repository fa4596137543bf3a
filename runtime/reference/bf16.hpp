// Moving reference tensors to and from bf16 (raw 16-bit patterns, core/bf16.hpp): inputs are generated as
// bf16, widened exactly to double for the reference, and GPU outputs are widened the same way to compare.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "reference/tensor.hpp"

namespace attnplan::reference {

// Exact: every bf16 value is a double. Throws Error(input) when the sizes disagree with `shape`.
Tensor tensor_from_bf16(std::span<const std::uint16_t> bits, std::vector<std::int64_t> shape);

// Each element rounded once, to nearest even (core::double_to_bf16).
std::vector<std::uint16_t> tensor_to_bf16(const Tensor& tensor);

// The tensor with every element rounded to the nearest bf16 and widened back: what a kernel that rounds
// its result to bf16 at best produces.
Tensor round_to_bf16(Tensor tensor);

}  // namespace attnplan::reference
