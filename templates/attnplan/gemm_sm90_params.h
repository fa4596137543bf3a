// Parameter block of the sm_90a projection GEMM (gemm_sm90.cuh), shared by host and NVRTC: the mma.sync
// kernel's GemmParams (pointers, sizes, segments, strides; the same semantics) plus the TMA tensor maps
// the host encodes per launch. Passed as a `__grid_constant__` kernel parameter, so the maps stay in
// parameter memory where TMA may read them.
#pragma once

#include "attnplan/gemm_params.h"
#include "attnplan/tensor_map.h"

namespace attnplan {

// The CTA tile of the sm_90a kernel along M and K: two consumer warpgroups of 64 rows each, and 64 bf16
// of K per stage (one 128-byte swizzled row). block_n is a trait (128, 160, 192 or 256).
inline constexpr int kGemmSm90BlockM = 128;
inline constexpr int kGemmSm90BlockK = 64;

// Whether tiles of `block_n` columns may straddle two weight segments. 128 and 256 may not: every segment
// but the last is a whole number of tiles wide (q | k | v widths are multiples of 128 heads' rows), and a
// CTA loads its share of a W slice with one TMA box. 160 and 192 may (they exist for N = 5120 and 6144 at
// few tokens, where 4096-wide q segments are not multiples of them): the share comes in 32-row pieces, each
// inside one segment, so only every segment but the last must be a multiple of 32.
ATTNPLAN_HOST_DEVICE constexpr bool gemm_sm90_tiles_straddle(int block_n) {
  return block_n % 128 != 0;
}
inline constexpr int kGemmSm90WPieceRows = 32;

// Rows of one W TMA box (the weight tensor maps' box height): a CTA's whole share of the slice, or one
// 32-row piece when a tile may straddle segments (with one segment nothing straddles).
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm90_w_box_rows(int block_n, int cluster_m, int segments) {
  return segments > 1 && gemm_sm90_tiles_straddle(block_n) ? kGemmSm90WPieceRows : block_n / cluster_m;
}

// The q|k|v projection's postprocess done by the epilogue (QkvEpilogueTraits, gemm_sm90_qkv_epilogue.cuh):
// per-head RMSNorm of q, k (weights below) and v (no weight), then RoPE, on each tile's fp32 values
// before the store (spec sections 3 and 4, the semantics of qkv_postprocess.cuh). Unused (null) with
// NoQkvEpilogue.
struct GemmQkvEpilogueParams {
  const float* rotations;          // [M, rotation_stride]: RmsNormParams' table, written by the input norm
  const bf16_bits* q_norm_weight;  // [D]; read only when the traits normalize q
  const bf16_bits* k_norm_weight;  // [D]; read only when the traits normalize k
  int rotation_stride;             // rope_rotation_stride(R) floats per token row
  float epsilon;                   // of the q, k and v norms
};

struct GemmSm90Params {
  // A [M, K] (row stride lda): dims {K, M}, box {block_k, block_m}, 128-byte swizzle, zero fill.
  TensorMap a_map;
  // Segment s of W, [n_end - n_begin, K] (row stride K): dims {K, rows}, box {block_k,
  // gemm_sm90_w_box_rows(...)}. Entries past the traits' segment count are unused.
  TensorMap w_maps[kMaxGemmSegments];
  // C [M, N] (row stride ldc): dims {N, M}, box {64, 64}, 128-byte swizzle: the epilogue's TMA stores
  // (gemm_sm90_epilogue.cuh). Unused by the other kernels that take these Params (gemm_sm90_w4.cuh).
  TensorMap c_map;
  GemmParams gemm;
  GemmQkvEpilogueParams qkv_epilogue;  // the bf16 kernel's fused postprocess only (gemm_sm90.cuh)
};

// The registers a CTA of `threads` holds from launch (a launch bound of one CTA per SM: 65536 / threads each,
// rounded down to 8). setmaxnreg moves registers only among its warps: the consumers' setmaxnreg.inc waits
// until the producers' .dec gave back what it takes, forever if the targets add up to more than this.
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm90_launch_registers(int threads) {
  return threads * (65536 / threads / 8 * 8);
}

// The epilogue's staging boxes (gemm_sm90_epilogue.cuh): per consumer warpgroup two [64, 64] bf16 boxes
// (one filled while the other's TMA store drains), 32 KiB for a CTA's two consumers. The fp8 kernel
// shares them.
inline constexpr int kGemmSm90StoreBox = 64;
inline constexpr int kGemmSm90StoreBoxBytes = kGemmSm90StoreBox * kGemmSm90StoreBox * 2;
inline constexpr int kGemmSm90StagingBytes = 2 * 2 * kGemmSm90StoreBoxBytes;

// Dynamic shared memory of the sm_90a kernel: `stages` slices of A [128, 64] and W [block_n, 64] bf16, the
// epilogue's staging boxes, the full/empty mbarriers (8 bytes each), and 1024 bytes to align the first
// slice to the 128-byte swizzle pattern's 1024-byte period. One formula for the traits and the host.
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm90_dynamic_shared_bytes(int block_n, int stages) {
  return stages * (kGemmSm90BlockM + block_n) * kGemmSm90BlockK * 2 + kGemmSm90StagingBytes + stages * 2 * 8 +
         1024;
}

}  // namespace attnplan
