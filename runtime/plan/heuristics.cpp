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
  // Four vectors a thread: a block loads its whole row before its reduction, so what a thread holds is what
  // it has in flight; at one 16-byte vector a thread (512 threads for 4096 channels) the norm moved ~3 TB/s
  // on an H200 (4.8 peak) and 2.6 on an H100, 2.9 at four (H100, session 56: 0.052 -> 0.048 ms at 8k
  // tokens). At least 4 warps (fewer leave the reduction's latency exposed) unless the row is shorter than
  // 4 warps of vectors; at most 1024 threads (longer rows take more vectors each).
  constexpr int kVectorsPerThread = 4;
  const int threads = round_up((vectors + kVectorsPerThread - 1) / kVectorsPerThread, 32);
  tiling.threads = std::clamp(threads, std::min(128, round_up(vectors, 32)), 1024);
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
