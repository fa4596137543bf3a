// Launch heuristics: pure functions from problem shapes to named tile/launch configurations.
// They need no GPU and are unit-tested; every choice that changes generated code goes through here.
#pragma once

#include "attnplan/vector_width.h"  // vector_width_for: the rule the kernel traits use too

namespace attnplan::plan {

using attnplan::vector_width_for;  // plan::vector_width_for, as before it moved to the shared header

// Input RMSNorm: one block per token row. Enough threads that each holds a few 16-byte vectors of
// its row in registers (the row is read once), but never more than a row's worth of vectors.
struct RmsNormTiling {
  int threads = 256;
  int vector = 8;              // bf16 elements per access
  int vectors_per_thread = 1;  // registers held per thread: vectors_per_thread * vector bf16
};
RmsNormTiling choose_rmsnorm_tiling(int hidden_size);

// Paged KV store: a block copies whole token rows ([kv_heads, dim] for k then v), a warp-multiple of
// threads sized to the wider row, and several tokens per block when rows are short so blocks stay busy.
struct KvStoreTiling {
  int threads = 128;
  int tokens_per_block = 1;
};
KvStoreTiling choose_kv_store_tiling(int kv_heads, int head_dim, int value_head_dim);

}  // namespace attnplan::plan
