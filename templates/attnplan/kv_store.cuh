// Paged KV store: copies the chunk's k and v rows into their slots of the paged cache (NHD layout).
// Each block handles kTokensPerBlock tokens; its threads sweep the (kv_head, dim) vectors of a row.
// With kFp8Cache the cache holds 1-byte e4m3fn codes, k / k_scale and v / v_scale (fp8_kv.cuh).
#pragma once

#include "attnplan/common.cuh"
#include "attnplan/fp8_kv.cuh"

namespace attnplan::kernels {

template <int kKvHeads, int kHeadDim, int kValueHeadDim, int kBlockSize, int kThreads, int kTokensPerBlock,
          bool kFp8Cache = false>  // defaulted: a bf16 cache (and stubs written before fp8) need not name it
struct KvStoreTraits {
  using Params = KvStoreParams;
  static constexpr int kv_heads = kKvHeads;
  static constexpr int head_dim = kHeadDim;
  static constexpr int value_head_dim = kValueHeadDim;
  static constexpr int block_size = kBlockSize;  // tokens per cache page
  static constexpr int threads = kThreads;
  static constexpr int tokens_per_block = kTokensPerBlock;
  static constexpr bool fp8_cache = kFp8Cache;  // 1-byte e4m3fn cache elements, quantized on the way in
  static constexpr int key_vector = vector_width_for(kHeadDim);
  static constexpr int value_vector = vector_width_for(kValueHeadDim);
  static constexpr int key_vectors = kKvHeads * kHeadDim / key_vector;  // per token
  static constexpr int value_vectors = kKvHeads * kValueHeadDim / value_vector;

  static_assert(kKvHeads > 0 && kHeadDim > 0 && kValueHeadDim > 0, "shapes must be positive");
  static_assert(kBlockSize > 0, "block_size must be positive");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "threads must be whole warps, at most 1024");
};

// Copies one token's [kv_heads, dim] row into the cache row at `slot`, `Vector` elements at a time.
template <int kVector, int kVectors, int kDim, int kThreads>
__device__ __forceinline__ void copy_row(const bf16_bits* source, bf16_bits* cache_row) {
  using Vector = BF16Vector<kVector>;
  for (int v = threadIdx.x; v < kVectors; v += kThreads) {
    Vector::load(source, v * kVector).store(cache_row, v * kVector);
  }
}

// The same row quantized into an fp8 cache row of 1-byte codes.
template <int kVector, int kVectors, int kThreads>
__device__ __forceinline__ void quantize_row(const bf16_bits* source, unsigned char* cache_row, float scale) {
  for (int v = threadIdx.x; v < kVectors; v += kThreads) {
    store_quantized<kVector>(source, v * kVector, cache_row, v * kVector, scale);
  }
}

// grid: [ceil(num_tokens / tokens_per_block)], block: [Traits::threads]
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) kv_store_kernel(const KvStoreParams params) {
  if (params.attention_items != nullptr && blockIdx.x == 0) {
    for (int i = threadIdx.x; i < params.attention_counters; i += blockDim.x) params.attention_items[i] = 0;
  }
  const int first = blockIdx.x * Traits::tokens_per_block;
  for (int token = first; token < min(first + Traits::tokens_per_block, params.num_tokens); ++token) {
    const int seq = sequence_of_token(params.query_starts, params.num_seqs, token);
    const int position = params.context_lens[seq] + token - params.query_starts[seq];
    // Batches the host could not check (device-side tables) must still never write outside the pool.
    if (position < 0) continue;
    const int logical_block = position / Traits::block_size;
    if (logical_block >= params.max_blocks_per_seq) continue;
    const int page =
        params.block_tables[static_cast<long long>(seq) * params.max_blocks_per_seq + logical_block];
    if (page < 0 || page >= params.num_blocks) continue;
    const long long slot = static_cast<long long>(page) * Traits::block_size + position % Traits::block_size;

    // cache rows: [kv_heads, head_dim] (key) and [kv_heads, value_head_dim] (value) elements per slot
    const long long key_offset = slot * (Traits::kv_heads * Traits::head_dim);
    const long long value_offset = slot * (Traits::kv_heads * Traits::value_head_dim);
    if constexpr (Traits::fp8_cache) {
      quantize_row<Traits::key_vector, Traits::key_vectors, Traits::threads>(
          params.key + token * params.key_row_stride,
          reinterpret_cast<unsigned char*>(params.key_cache) + key_offset, params.k_scale);
      quantize_row<Traits::value_vector, Traits::value_vectors, Traits::threads>(
          params.value + token * params.value_row_stride,
          reinterpret_cast<unsigned char*>(params.value_cache) + value_offset, params.v_scale);
    } else {
      copy_row<Traits::key_vector, Traits::key_vectors, Traits::head_dim, Traits::threads>(
          params.key + token * params.key_row_stride, params.key_cache + key_offset);
      copy_row<Traits::value_vector, Traits::value_vectors, Traits::value_head_dim, Traits::threads>(
          params.value + token * params.value_row_stride, params.value_cache + value_offset);
    }
  }
}

}  // namespace attnplan::kernels
