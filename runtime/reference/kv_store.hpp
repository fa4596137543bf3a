// Spec section 5: the chunk's k and v rows written to their slots of the paged KV cache.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "reference/batch.hpp"
#include "reference/tensor.hpp"

namespace attnplan::reference {

// Per-tensor scales of an fp8 e4m3fn cache (specs/formats.md): stored k_q = fp8(k / k_scale), read
// k = k_q * k_scale; likewise v. Floats, as the kernels receive them.
struct KvFp8Scales {
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// The paged cache in the NHD layout: key [num_blocks, block_size, kv_heads, head_dim],
// value [num_blocks, block_size, kv_heads, value_head_dim]. Slot = page * block_size + offset in page.
// With `fp8` set the cache models an fp8 e4m3fn cache: the tensors hold what the attention reads, the
// dequantized code * scale of each element (the codes themselves: quantize_kv_fp8 in core/fp8.hpp).
struct PagedKvCache {
  Tensor key;
  Tensor value;
  std::optional<KvFp8Scales> fp8 = std::nullopt;

  // Both tensors filled with `fill` (a sentinel lets tests see which slots were written).
  static PagedKvCache filled(std::int64_t num_blocks, int block_size, int kv_heads, int head_dim,
                             int value_head_dim, double fill = 0.0);

  std::int64_t num_blocks() const { return key.extent(0); }
  int block_size() const { return static_cast<int>(key.extent(1)); }
};

// Writes key [num_tokens, kv_heads, head_dim] and value [num_tokens, kv_heads, value_head_dim] into
// `cache` (an fp8 cache stores fp8_kv_value of each element) and returns the slot of each token row, in row
// order. Everything is checked before the first write, so on Error(input) the cache is unchanged: shapes that
// disagree, an invalid batch (validate_batch), a position beyond max_blocks_per_seq * block_size, a page
// outside [0, num_blocks), or two tokens that map to the same slot.
std::vector<std::int64_t> kv_store(const Tensor& key, const Tensor& value, const Batch& batch,
                                   PagedKvCache& cache);

// What an fp8 cache with scale `scale` holds for `value` after a store and a read: the e4m3fn code of
// float(value) / scale (fp32 division, round to nearest even, saturating to +-448; core::quantize_kv_fp8)
// times the scale. `value` is exact in float when it is a bf16 (what the GPU stores from).
double fp8_kv_value(double value, float scale);

}  // namespace attnplan::reference
