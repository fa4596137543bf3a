#include "plan/heuristics.hpp"

#include <algorithm>

namespace attnplan::plan {

namespace {
int round_up(int value, int multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
}  // namespace

RmsNormTiling choose_rmsnorm_tiling(int hidden_size) {
  RmsNormTiling tiling;
  tiling.vector = vector_width_for(hidden_size);
  const int vectors = hidden_size / tiling.vector;
  // Up to 1024 threads at one vector each; wider rows (hidden > 8192) take more vectors per thread.
  // Fewer than 4 warps per block would leave the reduction latency exposed, so start there when the
  // row is long enough to feed them.
  tiling.threads = std::clamp(round_up(vectors, 32), 32, 1024);
  tiling.vectors_per_thread = (vectors + tiling.threads - 1) / tiling.threads;
  return tiling;
}

KvStoreTiling choose_kv_store_tiling(int kv_heads, int head_dim, int value_head_dim) {
  KvStoreTiling tiling;
  const int key_vectors = kv_heads * head_dim / vector_width_for(head_dim);
  const int value_vectors = kv_heads * value_head_dim / vector_width_for(value_head_dim);
  const int widest = std::max(key_vectors, value_vectors);
  tiling.threads = std::clamp(round_up(widest, 32), 32, 512);
  // Aim for about 256 vector copies per block: short rows (MQA, small heads) batch several tokens.
  tiling.tokens_per_block = std::clamp(256 / widest, 1, 8);
  return tiling;
}

}  // namespace attnplan::plan
