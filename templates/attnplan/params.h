// Kernel parameter blocks: plain data passed by value to each kernel, the same header compiled by
// the host (C++20) and by NVRTC. No toolkit headers, no std:: — only builtin types, so NVRTC needs
// nothing to parse it and the host sees exactly the layout the device sees.
#pragma once

namespace attnplan {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ATTNPLAN_HOST_DEVICE __host__ __device__
#else
#define ATTNPLAN_HOST_DEVICE
#endif

// A bf16 value as 16 raw bits. Kernels reinterpret it as __nv_bfloat16; the host never does arithmetic on it.
struct alignas(2) bf16_bits {
  unsigned short bits;
};

// Input RMSNorm: output = input * rsqrt(mean(input^2) + epsilon) * (weight + weight_offset), in fp32,
// rounded once to bf16. weight_offset is a compile-time trait (0 or 1).
struct RmsNormParams {
  const bf16_bits* input;   // [num_tokens, hidden_size], rows contiguous
  const bf16_bits* weight;  // [hidden_size]
  bf16_bits* output;        // [num_tokens, hidden_size]; with fp8 codes, may be null (not written)
  int num_tokens;
  float epsilon;
  // The kernel with fp8 codes (RmsNormTraits::fp8_codes) also writes the rows `output` would hold as an
  // fp8-activation projection's input (Fp8QuantizeParams' layout); null codes: none. Others ignore these.
  unsigned char* codes;  // [num_tokens, hidden_size] e4m3fn, row stride ld_codes bytes
  float* scales;         // [ceil(hidden_size / 128), scale_ld]: token t, group g at g * scale_ld + t
  long long ld_codes;
  long long scale_ld;
  // The kernel with a rotation table (RmsNormTraits::rotary_pairs > 0: a plan whose q|k|v GEMM applies
  // RoPE in its epilogue, gemm_sm90_qkv_epilogue.cuh) also writes token t's row of the table: pair i's
  // (cos, sin) of RoPE's angle (rope.cuh's rotation_at) at rotations[t * rotation_stride + 2 i], + 1.
  // Null rotations: none. Others ignore these.
  float* rotations;           // [num_tokens, rotation_stride]
  const double* frequencies;  // [rotary_pairs] radians per position, after scaling
  const int* query_starts;    // [num_seqs + 1]: the batch's, for each token's position
  const int* context_lens;    // [num_seqs]
  int num_seqs;
  int rotation_stride;     // rope_rotation_stride(R)
  float attention_factor;  // multiplies cos and sin (yarn); 1 otherwise
};

// Floats per token row of the RoPE rotation table for rotary dim R: a (cos, sin) pair per rotated pair,
// rows padded to 16 bytes, so the epilogue's float4 reads of two pairs stay aligned and inside the row.
ATTNPLAN_HOST_DEVICE constexpr int rope_rotation_stride(int rotary_dim) {
  return (rotary_dim + 3) / 4 * 4;
}

// Paged KV store: the chunk's k and v rows written to their cache slots (NHD layout). With an fp8 cache
// (a compile-time trait) key_cache and value_cache point at 1-byte e4m3fn codes in the same layout,
// k_q = fp8(k / k_scale), v_q = fp8(v / v_scale); the pointers keep their bf16_bits type for one layout.
// Token t of sequence s (query_starts[s] <= t < query_starts[s + 1]) has position
// p = context_lens[s] + t - query_starts[s] and slot block_tables[s][p / block_size] * block_size + p %
// block_size.
struct KvStoreParams {
  const bf16_bits* key;     // [num_tokens, kv_heads, head_dim], row stride key_row_stride elements
  const bf16_bits* value;   // [num_tokens, kv_heads, value_head_dim], row stride value_row_stride elements
  bf16_bits* key_cache;     // [num_blocks, block_size, kv_heads, head_dim]
  bf16_bits* value_cache;   // [num_blocks, block_size, kv_heads, value_head_dim]
  const int* block_tables;  // [num_seqs, max_blocks_per_seq]
  const int* query_starts;  // [num_seqs + 1], non-decreasing, query_starts[num_seqs] == num_tokens
  const int* context_lens;  // [num_seqs]
  long long key_row_stride;
  long long value_row_stride;
  int num_tokens;
  int num_seqs;
  int max_blocks_per_seq;
  int num_blocks;  // pages in the pool; a block table entry outside [0, num_blocks) is never written
  float k_scale;   // fp8 cache only: finite, > 0 (checked by the host)
  float v_scale;
  // Set by execute: the counters of the attention launch that follows on the stream, which block 0 zeroes
  // (a separate memset would add a node and its gap to every layer): attention_counters ints, the item
  // counter (AttentionParams::item_counter) then the split tail's part counters (split_counters). Null:
  // nothing else is written.
  int* attention_items;
  int attention_counters;
};

}  // namespace attnplan
