// Shapes of the sm_90a mixed-input GEMM (gemm_sm90_w4.cuh: 4- or 8-bit weights, bf16 activations), shared
// by host and NVRTC. Its kernel parameter is GemmSm90Params (gemm_sm90_params.h) with other boxes:
//   a_map     X [M, K] bf16 (the GEMM's A): dims {K, M}, box {64, block_tokens}, 128-byte swizzle;
//   w_maps[s] segment s's 4-bit codes as bytes [rows, K / 2] (low nibble = even k): dims {K / 2, rows},
//             box {32, 128}, no swizzle; GPTQ's words [K / 8, rows]: dims {rows, K / 8}, box {128, 8};
//             8-bit codes as bytes [rows, K]: dims {K, rows}, box {64, 128}, no swizzle;
//   c_map     C [M, N] as in gemm_sm90_params.h (the epilogue's TMA stores).
// Out-of-bounds elements of both load as zeros.
#pragma once

#include "attnplan/gemm_sm90_params.h"

namespace attnplan {

// Weight rows (output features, columns of C) per tile: two consumer warpgroups of 64, the wgmma M.
inline constexpr int kGemmSm90W4BlockRows = 128;
// K per ring slot: one 128-byte swizzled row of X and 32 bytes of codes per weight row.
inline constexpr int kGemmSm90W4BlockK = 64;

// Dynamic shared memory: `stages` slots of X [block_tokens, 64] bf16 and codes [128, 64 * bits / 8]
// bytes, the epilogue's staging boxes, the full/empty mbarriers (8 bytes each), and 1024 bytes to align the
// ring to the swizzle period. One formula for the traits and the host.
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm90_w4_dynamic_shared_bytes(int block_tokens, int stages,
                                                                     int bits = 4) {
  return stages *
             (block_tokens * kGemmSm90W4BlockK * 2 + kGemmSm90W4BlockRows * kGemmSm90W4BlockK * bits / 8) +
         kGemmSm90StagingBytes + stages * 2 * 8 + 1024;
}

}  // namespace attnplan
