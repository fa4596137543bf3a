// A compiled plan loaded on one device: modules loaded, functions resolved, shared-memory attributes
// set once. Launching allocates nothing and never synchronizes with the host, so a host engine can
// capture it in a CUDA graph on its own stream.
#pragma once

#include <cuda.h>

#include <memory>

#include "plan/compiled_plan.hpp"

namespace attnplan {
class Runtime;
}

namespace attnplan::plan {

// The batch of specs/attention.md section 8, as device pointers plus host-side bounds.
struct BatchDescription {
  int num_seqs = 0;
  int num_tokens = 0;                 // total tokens in the chunk (host copy of query_starts[num_seqs])
  const int* query_starts = nullptr;  // device, [num_seqs + 1]
  const int* context_lens = nullptr;  // device, [num_seqs]
  const int* block_tables = nullptr;  // device, [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
};

// The caller's paged KV cache (NHD): K [num_blocks, block_size, kv_heads, head_dim], V likewise with
// value_head_dim. bf16 elements.
struct KvCacheView {
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  int num_blocks = 0;
};

// Stage entry points. All pointers are device pointers to bf16 data unless said otherwise.
struct InputNormArgs {
  const void* input = nullptr;   // [num_tokens, hidden_size]
  const void* weight = nullptr;  // [hidden_size]
  void* output = nullptr;        // [num_tokens, hidden_size]
  int num_tokens = 0;
};

struct KvStoreArgs {
  const void* key = nullptr;       // [num_tokens, kv_heads, head_dim] rows, key_row_stride elements apart
  const void* value = nullptr;     // [num_tokens, kv_heads, value_head_dim] rows
  long long key_row_stride = 0;    // 0: kv_heads * head_dim (dense)
  long long value_row_stride = 0;  // 0: kv_heads * value_head_dim (dense)
  KvCacheView cache;
  BatchDescription batch;
};

class PrefillPlan {
 public:
  PrefillPlan(PrefillPlan&&) noexcept;
  PrefillPlan& operator=(PrefillPlan&&) noexcept;
  ~PrefillPlan();

  const CompiledPlan& compiled() const { return compiled_; }

  // Bytes of scratch the caller must pass to execute for up to `max_tokens` tokens. The two foundation
  // stages need none; the whole layer's intermediates will.
  std::size_t workspace_bytes(int max_tokens) const;

  // Each checks its arguments against the plan before launching (Error(input) naming the field) and
  // launches on `stream` without synchronizing.
  void launch_input_norm(const InputNormArgs& args, CUstream stream) const;
  void launch_kv_store(const KvStoreArgs& args, CUstream stream) const;

 private:
  friend class ::attnplan::Runtime;
  struct Loaded;
  PrefillPlan(CompiledPlan compiled, std::unique_ptr<Loaded> loaded);
  CompiledPlan compiled_;
  std::unique_ptr<Loaded> loaded_;
};

}  // namespace attnplan::plan
