// Parameter block of the sm_89 fp8-activation GEMM (gemm_sm89_fp8.cuh), shared by host and NVRTC. It reads
// the codes and scales fp8_quantize_kernel wrote (gemm_sm90_fp8_params.h states the rounding rule).
#pragma once

#include "attnplan/gemm_params.h"

namespace attnplan {

// C[M, N] = (A_codes * a_scale) · (W_codes * w_scale)^T (+ bias), fp32 partial sums per 128-wide K group
// promoted into fp32 accumulators, one rounding to bf16.
struct GemmSm89Fp8Params {
  // Sizes, segments (weight = e4m3 codes [rows, K] with row stride K bytes, scales = f32 weight scales),
  // C, bias; `a` is not read.
  GemmParams gemm;
  const unsigned char* a_codes;  // [M, K] e4m3fn, row stride ld_codes bytes (Fp8QuantizeParams::codes)
  long long ld_codes;
  const float* a_scales;  // [groups, a_scale_ld] (Fp8QuantizeParams::scales)
  long long a_scale_ld;
};

// The tile: [128, 128] of C, K tiles of 64 codes (two per 128-channel scale group). Shared-memory rows are
// padded to 80 bytes so that the 4-byte fragment loads of 8 rows x 4 lanes hit 32 distinct banks.
inline constexpr int kGemmSm89Fp8BlockM = 128;
inline constexpr int kGemmSm89Fp8BlockN = 128;
inline constexpr int kGemmSm89Fp8BlockK = 64;
inline constexpr int kGemmSm89Fp8RowBytes = kGemmSm89Fp8BlockK + 16;

// `stages` slots of A [128, 64] and W [128, 64] e4m3 in padded rows (4 stages: 80 KiB, inside sm_89's 99).
ATTNPLAN_HOST_DEVICE constexpr int gemm_sm89_fp8_dynamic_shared_bytes(int stages) {
  return stages * (kGemmSm89Fp8BlockM + kGemmSm89Fp8BlockN) * kGemmSm89Fp8RowBytes;
}

}  // namespace attnplan
