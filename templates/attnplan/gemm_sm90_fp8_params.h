// Parameter blocks of the fp8-activation projection path (gemm_sm90_fp8.cuh), shared by host and NVRTC:
// the activation quantizer's and the sm_90a e4m3 x e4m3 GEMM's.
//
// Activation rounding (the contract the CPU reference repeats, reference/fp8_activation.hpp): A [M, K] is
// cut into scale groups per token: the whole row where the weight scales are per tensor or per channel
// (formats.md: activations quantized per token), 128 channels where they are 128x128 blocks (the last group
// may be shorter); per group
//   amax  = max |a| over the group (bf16 values, exact in fp32)
//   scale = amax / 448 in fp32 (IEEE division, round to nearest), or 1 when amax is 0
//   code  = e4m3fn(a / scale): the quotient in fp32 (IEEE division), then round to nearest even,
//           saturating to +-448 (__NV_SATFINITE)
// and the GEMM reads a = code * scale. Block weights need a scale per 128-wide K block anyway (the
// promotion multiplies each block's fp32 partial sums by it). With one scale per token the promotion is an
// add and the scale a factor of the whole row, applied once in the epilogue, as `_scaled_mm`'s row-wise
// scales are: the K loop then reads no scale (the per-group factors' loads and their index arithmetic
// were where its "dispatch" stalls sat, docs/kernels-notes.md "Session 33").
#pragma once

#include "attnplan/gemm_params.h"
#include "attnplan/gemm_sm90_params.h"  // the epilogue's staging boxes
#include "attnplan/tensor_map.h"

namespace attnplan {

inline constexpr int kFp8ActivationGroup = 128;       // channels per activation scale, block weights
inline constexpr int kFp8TokenQuantizeThreads = 256;  // the per-token quantizer's CTA: one token
inline constexpr int kFp8QuantizeWarps = 8;           // warps per quantizer CTA
inline constexpr int kFp8QuantizeGroupsPerWarp = 2;   // (token, group) items per warp: one per half-warp

// Whether a GEMM of weight scale granularity `granularity` (0 tensor, 1 channel, 2 128x128 blocks) reads
// one activation scale per token (the rule above; config::fp8_activation_scales on the host).
ATTNPLAN_HOST_DEVICE constexpr bool fp8_uses_token_scales(int granularity) {
  return granularity != 2;
}

// The e4m3 activations and their scales in the caller's workspace.
struct Fp8QuantizeParams {
  const bf16_bits* input;  // [M, K], row stride ld_input elements
  unsigned char* codes;    // [M, K] e4m3fn, row stride ld_codes bytes (a multiple of 16: TMA rows)
  // [groups, scale_ld]: the scale of token m, group g at g * scale_ld + m; groups = ceil(K / 128), or 1
  // with one scale per token
  float* scales;
  long long ld_input;
  long long ld_codes;
  long long scale_ld;  // >= M
  int m;
  int k;
};

// The sm_90a fp8 GEMM: C[M, N] = (A_codes * a_scale) · (W_codes * w_scale)^T (+ bias), fp32 partial sums
// per 128-wide K block promoted into fp32 accumulators, one rounding to bf16.
struct GemmSm90Fp8Params {
  // A codes [M, K] (row stride ld_codes bytes): dims {K, M}, box {128, 128}, 128-byte swizzle.
  TensorMap a_map;
  // Segment s of W codes [rows, K] (row stride K bytes): dims {K, rows}, box {128, 128}.
  TensorMap w_maps[kMaxGemmSegments];
  // C [M, N] bf16: the epilogue's TMA stores, as GemmSm90Params::c_map.
  TensorMap c_map;
  // Sizes, segments (weight = e4m3 codes, scales = f32 weight scales), C, bias; `a` is not read.
  GemmParams gemm;
  const float* a_scales;  // [groups, a_scale_ld] (Fp8QuantizeParams::scales)
  long long a_scale_ld;
  GemmQkvEpilogueParams qkv_epilogue;  // the fused q|k|v postprocess only (QkvEpilogue traits)
};

// The fp8 kernel's tile: [128, 128] of C, K blocks of 128 codes (one 128-byte swizzled row, and exactly
// one activation group and one weight scale block per ring slot).
inline constexpr int kGemmSm90Fp8BlockM = 128;
inline constexpr int kGemmSm90Fp8BlockN = 128;
inline constexpr int kGemmSm90Fp8BlockK = 128;

// `stages` slots of A [128, 128] and W [128, 128] e4m3, the epilogue's staging boxes, full/empty mbarriers,
// 1024 bytes of alignment.
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm90_fp8_dynamic_shared_bytes(int stages) {
  return stages * (kGemmSm90Fp8BlockM + kGemmSm90Fp8BlockN) * kGemmSm90Fp8BlockK + kGemmSm90StagingBytes +
         stages * 2 * 8 + 1024;
}

}  // namespace attnplan
