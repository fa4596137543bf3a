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

// A token's [kv_heads, dim] row quantized into an fp8 cache row of 1-byte codes.
template <int kVector, int kVectors, int kThreads>
__device__ __forceinline__ void quantize_row(const bf16_bits* source, unsigned char* cache_row, float scale) {
  for (int v = threadIdx.x; v < kVectors; v += kThreads) {
    store_quantized<kVector>(source, v * kVector, cache_row, v * kVector, scale);
  }
}

// The cache slot of the chunk's token, or -1 where the token is skipped. Batches the host could not check
// (device-side tables) must still never write outside the pool.
template <class Traits>
__device__ __forceinline__ long long kv_slot_of_token(const KvStoreParams& params, int token) {
  const int seq = sequence_of_token(params.query_starts, params.num_seqs, token);
  const int position = params.context_lens[seq] + token - params.query_starts[seq];
  if (position < 0) return -1;
  const int logical_block = position / Traits::block_size;
  if (logical_block >= params.max_blocks_per_seq) return -1;
  const int page =
      params.block_tables[static_cast<long long>(seq) * params.max_blocks_per_seq + logical_block];
  if (page < 0 || page >= params.num_blocks) return -1;
  return static_cast<long long>(page) * Traits::block_size + position % Traits::block_size;
}

// A thread's vectors of one [kv_heads, dim] row (vector v = threadIdx.x + p * kThreads of pass p), loaded
// from the chunk's row or stored into the cache row.
template <int kVectors, int kThreads, int N, int kPasses>
__device__ __forceinline__ void load_row(const bf16_bits* row, BF16Vector<N> (&held)[kPasses]) {
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int v = threadIdx.x + p * kThreads;
    if (v < kVectors) held[p] = BF16Vector<N>::load(row, v * N);
  }
}

template <int kVectors, int kThreads, int N, int kPasses>
__device__ __forceinline__ void store_row(const BF16Vector<N> (&held)[kPasses], bf16_bits* row) {
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int v = threadIdx.x + p * kThreads;
    if (v < kVectors) held[p].store(row, v * N);
  }
}

// The bf16 cache: a thread first loads its vectors of every token of the block, all in flight at once (a
// source row does not depend on its slot), then looks the slots up (three dependent loads a token), then
// stores. Copying each token's rows after its own lookup, as before session 56, kept one 16-byte load a
// thread in flight behind that chain (Llama-3.1-8B at 8k tokens on an H100: 0.025 -> 0.023 ms, 2.7 -> 2.9
// TB/s of the card's 3.35; docs/kernels-notes.md "Session 56").
template <class Traits>
__device__ __forceinline__ void store_bf16_rows(const KvStoreParams& params, int first) {
  constexpr int tokens = Traits::tokens_per_block;
  constexpr int threads = Traits::threads;
  BF16Vector<Traits::key_vector> keys[tokens][(Traits::key_vectors + threads - 1) / threads];
  BF16Vector<Traits::value_vector> values[tokens][(Traits::value_vectors + threads - 1) / threads];
#pragma unroll
  for (int t = 0; t < tokens; ++t) {
    const int token = first + t;
    if (token >= params.num_tokens) break;
    load_row<Traits::key_vectors, threads>(params.key + token * params.key_row_stride, keys[t]);
    load_row<Traits::value_vectors, threads>(params.value + token * params.value_row_stride, values[t]);
  }
  long long slots[tokens];
#pragma unroll
  for (int t = 0; t < tokens; ++t)
    slots[t] = first + t < params.num_tokens ? kv_slot_of_token<Traits>(params, first + t) : -1;
#pragma unroll
  for (int t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    // cache rows: [kv_heads, head_dim] (key) and [kv_heads, value_head_dim] (value) elements per slot
    store_row<Traits::key_vectors, threads>(
        keys[t], params.key_cache + slots[t] * (Traits::kv_heads * Traits::head_dim));
    store_row<Traits::value_vectors, threads>(
        values[t], params.value_cache + slots[t] * (Traits::kv_heads * Traits::value_head_dim));
  }
}

// grid: [ceil(num_tokens / tokens_per_block)], block: [Traits::threads]
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) kv_store_kernel(const KvStoreParams params) {
  if (params.attention_items != nullptr && blockIdx.x == 0) {
    for (int i = threadIdx.x; i < params.attention_counters; i += blockDim.x) params.attention_items[i] = 0;
  }
  const int first = blockIdx.x * Traits::tokens_per_block;
  if constexpr (Traits::fp8_cache) {
    for (int token = first; token < min(first + Traits::tokens_per_block, params.num_tokens); ++token) {
      const long long slot = kv_slot_of_token<Traits>(params, token);
      if (slot < 0) continue;
      quantize_row<Traits::key_vector, Traits::key_vectors, Traits::threads>(
          params.key + token * params.key_row_stride,
          reinterpret_cast<unsigned char*>(params.key_cache) + slot * (Traits::kv_heads * Traits::head_dim),
          params.k_scale);
      quantize_row<Traits::value_vector, Traits::value_vectors, Traits::threads>(
          params.value + token * params.value_row_stride,
          reinterpret_cast<unsigned char*>(params.value_cache) +
              slot * (Traits::kv_heads * Traits::value_head_dim),
          params.v_scale);
    }
  } else {
    store_bf16_rows<Traits>(params, first);
  }
}

}  // namespace attnplan::kernels
