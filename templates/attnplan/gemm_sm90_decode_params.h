// Shapes of the sm_90a decoding GEMM (gemm_sm90_decode.cuh: 4- or 8-bit weight codes decoded into the bf16
// wgmma kernel's W slots), shared by host and NVRTC. Its kernel parameter is GemmSm90Params
// (gemm_sm90_params.h) with other weight boxes:
//   a_map     A [M, K] bf16 as the bf16 kernel's: dims {K, M}, box {64, 128}, 128-byte swizzle;
//   w_maps[s] segment s's codes as bytes [rows, K * bits / 8] (4 bits: low nibble = even k): dims
//             {K * bits / 8, rows}, box {64 * bits / 8, gemm_sm90_decode_code_box_rows(block_n, cluster_m,
//             segments)}, no swizzle;
//   c_map     C [M, N] as in gemm_sm90_params.h (the epilogue's TMA stores).
// Out-of-bounds codes load as zeros.
#pragma once

#include "attnplan/gemm_sm90_params.h"

namespace attnplan {

// Rows of one code TMA box: a CTA's share of the slice (block_n / cluster_m rows: with clusters along M
// each CTA decodes its share and copies it to the others), or, where tiles straddle segments, 32-row
// pieces (16 where the share is no multiple of 32, e.g. 192 / 4).
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm90_decode_code_box_rows(int block_n, int cluster_m, int segments) {
  const int share = block_n / cluster_m;
  if (segments == 1 || !gemm_sm90_tiles_straddle(block_n)) return share;
  return share % kGemmSm90WPieceRows == 0 ? kGemmSm90WPieceRows : 16;
}

// One code slot: the codes of a CTA's share of a W slice [block_n / cluster_m rows, 64 k] (each CTA of a
// cluster loads and decodes only its share).
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm90_decode_code_slot_bytes(int block_n, int cluster_m, int bits) {
  return block_n / cluster_m * kGemmSm90BlockK * bits / 8;
}

// Dynamic shared memory: the bf16 kernel's (`stages` slots of A [128, 64] and W [block_n, 64] bf16, the
// staging boxes, the slot barriers, the alignment slack) plus `code_stages` code slots, their "full"
// barriers and their reader counts, and a writer count per ring slot. One formula for the traits and the
// host.
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm90_decode_dynamic_shared_bytes(int block_n, int cluster_m,
                                                                         int stages, int code_stages,
                                                                         int bits) {
  return gemm_sm90_dynamic_shared_bytes(block_n, stages) +
         code_stages * (gemm_sm90_decode_code_slot_bytes(block_n, cluster_m, bits) + 8 + 4) + stages * 4;
}

}  // namespace attnplan
