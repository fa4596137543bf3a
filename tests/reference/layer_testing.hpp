// Helpers shared by the layer-stage tests: small configs built in code and paged caches filled
// through the real kv_store, so the tests index the cache exactly as attention() reads it.
#pragma once

#include <cstdint>
#include <vector>

#include "config/attention_config.hpp"
#include "config/parse.hpp"
#include "reference/layer.hpp"

namespace attnplan::reference::testing {

// A config with the given shapes, defaults resolved (attention_scale = 1/sqrt(D), rotary dim = D, ...).
// Deliberately not validated: the tests use head dims far below the kernels' minimum.
inline config::AttentionConfig small_config(int query_heads, int kv_heads, int head_dim, int value_head_dim) {
  config::AttentionConfig config;
  config.hidden_size = 8;
  config.query_heads = query_heads;
  config.kv_heads = kv_heads;
  config.head_dim = head_dim;
  config.value_head_dim = value_head_dim;
  config::resolve_defaults(config);
  return config;
}

// One sequence, no prefix, `tokens` tokens on pages 0, 1, 2, ... of `block_size` tokens.
inline Batch one_sequence(int tokens, int block_size, int context_len = 0) {
  Batch batch;
  batch.query_starts = {0, tokens};
  batch.context_lens = {context_len};
  batch.max_blocks_per_seq = (context_len + tokens + block_size - 1) / block_size;
  for (int page = 0; page < batch.max_blocks_per_seq; ++page) batch.block_tables.push_back(page);
  return batch;
}

}  // namespace attnplan::reference::testing
