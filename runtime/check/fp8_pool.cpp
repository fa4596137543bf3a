#include "check/fp8_pool.hpp"

#include <cmath>

#include "core/bf16.hpp"
#include "core/fp8.hpp"

namespace attnplan::check {

std::vector<std::uint8_t> quantize_kv_pool_fp8(const std::vector<std::uint16_t>& pool, float scale,
                                               std::uint8_t nan_code) {
  std::vector<std::uint8_t> codes(pool.size());
  for (std::size_t i = 0; i < pool.size(); ++i) {
    const float value = core::bf16_to_float(pool[i]);
    codes[i] = std::isnan(value) ? nan_code : core::quantize_kv_fp8(value, scale);
  }
  return codes;
}

}  // namespace attnplan::check
