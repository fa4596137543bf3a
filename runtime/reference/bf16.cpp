#include "reference/bf16.hpp"

#include <utility>

#include "core/bf16.hpp"

namespace attnplan::reference {

Tensor tensor_from_bf16(std::span<const std::uint16_t> bits, std::vector<std::int64_t> shape) {
  return Tensor(std::move(shape), core::bf16_to_doubles(bits));
}

std::vector<std::uint16_t> tensor_to_bf16(const Tensor& tensor) {
  std::vector<std::uint16_t> bits(tensor.data.size());
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = core::double_to_bf16(tensor.data[i]);
  return bits;
}

Tensor round_to_bf16(Tensor tensor) {
  for (double& value : tensor.data)
    value = static_cast<double>(core::bf16_to_float(core::double_to_bf16(value)));
  return tensor;
}

}  // namespace attnplan::reference
