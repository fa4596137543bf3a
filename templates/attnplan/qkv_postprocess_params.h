// Params of the QKV postprocess kernel (spec sections 3 and 4): per-head RMSNorm and RoPE applied in
// place to the fused QKV projection output. Plain data, compiled by the host (C++20) and by NVRTC,
// builtin types only (see params.h).
#pragma once

#include "attnplan/params.h"

namespace attnplan {

// One row per token of the fused projection output, columns [q: Hq * D | k: Hkv * D | v: Hkv * Dv].
// Token t of sequence s (query_starts[s] <= t < query_starts[s + 1]) has position
// p = context_lens[s] + t - query_starts[s]; pair i of a q or k head turns by p * frequencies[i].
// Shapes (Hq, Hkv, D, Dv, R), the norm flags and the pairing are compile-time traits of the kernel.
struct QkvPostprocessParams {
  bf16_bits* qkv;                  // [num_tokens, Hq * D + Hkv * D + Hkv * Dv], row stride qkv_row_stride
  const bf16_bits* q_norm_weight;  // [D]; read only when the traits enable the q norm
  const bf16_bits* k_norm_weight;  // [D]; read only when the traits enable the k norm
  const double* frequencies;       // [R / 2] radians per position, after scaling; read only when R > 0
  const int* query_starts;         // [num_seqs + 1], non-decreasing, query_starts[num_seqs] == num_tokens
  const int* context_lens;         // [num_seqs]
  long long qkv_row_stride;        // elements between token rows (>= the row width)
  int num_tokens;
  int num_seqs;
  float epsilon;           // of the q, k and v norms
  float attention_factor;  // multiplies cos and sin (yarn); 1 otherwise
};

}  // namespace attnplan
