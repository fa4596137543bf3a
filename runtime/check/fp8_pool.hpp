// The fp8 KV cache pool a check or a test starts from: a bf16 pool quantized the way the fp8 KV store
// would have written it (core::quantize_kv_fp8, per element), so that the GPU and the CPU reference read
// the same codes.
#pragma once

#include <cstdint>
#include <vector>

namespace attnplan::check {

// codes[i] = fp8_e4m3(bf16(pool[i]) / scale), saturating (core/fp8.hpp). A NaN element (an unwritten
// slot's marker) becomes `nan_code`: 0x7F, the code the conversion gives NaN, or 0xFF (also NaN) where
// the caller tells poisoned slots apart from anything the store writes.
std::vector<std::uint8_t> quantize_kv_pool_fp8(const std::vector<std::uint16_t>& pool, float scale,
                                               std::uint8_t nan_code = 0x7F);

}  // namespace attnplan::check
