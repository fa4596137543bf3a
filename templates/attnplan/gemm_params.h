// Parameter block of the bf16 projection GEMM (QKV and output projections), shared by host and NVRTC.
// Like params.h: builtin types only, the same layout on both sides.
#pragma once

#include "attnplan/params.h"

namespace attnplan {

// The most weight segments one GEMM concatenates along N: q_proj | k_proj | v_proj.
inline constexpr int kMaxGemmSegments = 3;

// Rows [n_begin, n_end) of the logical weight W [N, K], stored on their own: separate q/k/v
// projections produce one fused output row without copying weights. A fused qkv_proj is one segment.
struct GemmSegment {
  // bf16: [n_end - n_begin, K], rows contiguous (row stride K), HF nn.Linear layout. A quantized weight
  // policy (gemm.cuh) reads the packed bytes of the same rows through this pointer: fp8 / mxfp8 one byte
  // per value ([rows, K]), mxfp4 / nvfp4 two values per byte, low nibble first ([rows, K / 2]).
  const bf16_bits* weight;
  const bf16_bits* bias;  // [n_end - n_begin], or null: no bias on this segment (read only with has_bias)
  int n_begin;
  int n_end;
  // Quantized weights only (null for bf16): the scale tensor of the segment's rows in the checkpoint's
  // layout (fp8: f32 [] / [rows] / [ceil(rows / 128), ceil(K / 128)]; mxfp8, mxfp4: E8M0 bytes
  // [rows, K / 32]; nvfp4: e4m3 bytes [rows, K / 16]) and nvfp4's per-tensor f32 weight_scale_2.
  const void* scales = nullptr;
  const float* scale_2 = nullptr;
  // packed_integer: qzeros i32 [groups, rows / (32 / bits)] as stored, scales f32 [groups, rows], and with
  // act order g_idx i32 [K]. affine: scales and biases (here) f32 [rows, K / group_size]. Word-copied
  // formats (gemm.cuh) read their weight through `weight` too: GPTQ [K / (32 / bits), rows] and AWQ
  // [K, rows / 8] i32 words, MLX [rows, K * bits / 32] u32.
  const void* zeros = nullptr;
  const int* g_idx = nullptr;
};

// C[M, N] = A[M, K] · W[N, K]^T (+ bias[N]): fp32 accumulation, bias added in fp32, one rounding to bf16.
// Segments tile [0, N) in order: segments[0].n_begin == 0, segments[s].n_end == segments[s + 1].n_begin,
// and the last used segment ends at N. Entries past the traits' segment count are ignored.
// Alignment (checked by plan::GemmSpec::check): a, c and every weight 16-byte aligned; lda, ldc and K
// multiples of 8 elements (16-byte rows).
struct GemmParams {
  const bf16_bits* a;  // [M, K], row stride lda elements
  bf16_bits* c;        // [M, N], row stride ldc elements; columns [N, ldc) are never written
  GemmSegment segments[kMaxGemmSegments];
  long long lda;
  long long ldc;
  int m;
  int n;
  int k;
};

// The dequantize kernel (dequantize.cuh): a quantized projection weight -> bf16 W [N, K], for the bf16
// GEMM. gemm holds the projection's Params as the quantized GEMM would get them (segments, N, K; a, c, m,
// lda and ldc are not read); weight receives W [gemm.n, gemm.k] bf16, row stride gemm.k, 16-byte aligned.
struct DequantizeParams {
  GemmParams gemm;
  bf16_bits* weight;
};

// Its CTA tile: [64 W rows, 64 k], 256 threads (two 16-byte stores each).
inline constexpr int kDequantizeBlockRows = 64;
inline constexpr int kDequantizeBlockK = 64;
inline constexpr int kDequantizeThreads = 256;

// The group-table dequantize kernel (dequantize.cuh, weights that look up each k's group: act-order GPTQ):
// a CTA takes [64 W rows, 512 k], 256 threads, and stages its rows' scale and zero of every group.
inline constexpr int kDequantizeTableBlockRows = 64;
inline constexpr int kDequantizeTableBlockK = 512;

// Its dynamic shared memory, in bytes, for `groups` groups of `bits`-bit codes: the table (a float pair per
// group and row), the code words ([block_k / (32 / bits), block_rows] words) and one group offset per k.
ATTNPLAN_HOST_DEVICE constexpr int dequantize_table_shared_bytes(int groups, int bits) {
  return groups * kDequantizeTableBlockRows * 8 +
         kDequantizeTableBlockK * bits / 32 * kDequantizeTableBlockRows * 4 + kDequantizeTableBlockK * 4;
}

// Dynamic shared memory of a GEMM specialization, in bytes: `stages` slices of A [block_m, block_k] in
// bf16 and of W [block_n, block_k] at `weight_bits` per value, plus (quantized weights, bits < 16) one bf16
// [block_n, block_k] tile the packed slice is dequantized into; reused by the epilogue as a bf16
// [block_m, block_n + 8] staging tile. One formula for the kernel's traits and for the host, which must
// allow it on the function (> 48 KiB).
ATTNPLAN_HOST_DEVICE constexpr int gemm_dynamic_shared_bytes(int block_m, int block_n, int block_k,
                                                             int stages, int weight_bits = 16) {
  const int dequantized = weight_bits < 16 ? block_n * block_k * 2 : 0;
  const int pipeline = stages * (block_m * block_k * 2 + block_n * block_k * weight_bits / 8) + dequantized;
  const int staging = block_m * (block_n + 8) * 2;
  return pipeline > staging ? pipeline : staging;
}

}  // namespace attnplan
