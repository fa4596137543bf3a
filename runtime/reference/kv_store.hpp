// Spec section 5: the chunk's k and v rows written to their slots of the paged KV cache.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/batch.hpp"
#include "reference/tensor.hpp"

namespace attnplan::reference {

// The paged cache in the NHD layout: key [num_blocks, block_size, kv_heads, head_dim],
// value [num_blocks, block_size, kv_heads, value_head_dim]. Slot = page * block_size + offset in page.
struct PagedKvCache {
  Tensor key;
  Tensor value;

  // Both tensors filled with `fill` (a sentinel lets tests see which slots were written).
  static PagedKvCache filled(std::int64_t num_blocks, int block_size, int kv_heads, int head_dim,
                             int value_head_dim, double fill = 0.0);

  std::int64_t num_blocks() const { return key.extent(0); }
  int block_size() const { return static_cast<int>(key.extent(1)); }
};

// Writes key [num_tokens, kv_heads, head_dim] and value [num_tokens, kv_heads, value_head_dim] into
// `cache` and returns the slot of each token row, in row order. Everything is checked before the first
// write, so on Error(input) the cache is unchanged: shapes that disagree, an invalid batch (validate_batch),
// a position beyond max_blocks_per_seq * block_size, a page outside [0, num_blocks), or two tokens that
// map to the same slot.
std::vector<std::int64_t> kv_store(const Tensor& key, const Tensor& value, const Batch& batch,
                                   PagedKvCache& cache);

}  // namespace attnplan::reference
