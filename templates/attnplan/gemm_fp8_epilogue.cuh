// The epilogue pieces the fp8-activation GEMMs share (gemm_sm90_fp8.cuh, gemm_sm89_fp8.cuh): per column
// pair, the weight scale that is constant along K and the bias; then one bf16 rounding and store.
#pragma once

#include <cuda_bf16.h>

#include "attnplan/gemm_params.h"

namespace attnplan::kernels {

struct Fp8ColumnPair {
  float scale0 = 1.0f, scale1 = 1.0f;  // weight scales of columns n, n + 1
  float bias0 = 0.0f, bias1 = 0.0f;

  // C[m, n] and C[m, n + 1] before the bf16 rounding, from the fp32 accumulators of the pair.
  __device__ __forceinline__ float2 apply(float accumulator0, float accumulator1) const {
    return make_float2(accumulator0 * scale0 + bias0, accumulator1 * scale1 + bias1);
  }
};

// Columns `column` and column + 1 (`pair`: both inside N) of `segment`, counted from its first column.
// kGranularity as the kernels': 0 one f32 scale per tensor, 1 one per row of W (column of C), 2 128x128
// blocks, already applied per K block (scale 1 here). With `column` a base plus a constant (a thread's
// pairs of a tile), the loads are immediate offsets from one address.
template <int kGranularity, bool kHasBias>
__device__ __forceinline__ Fp8ColumnPair fp8_segment_columns(const GemmSegment& segment, int column,
                                                             bool pair) {
  Fp8ColumnPair terms;
  const float* w_scales = static_cast<const float*>(segment.scales);
  if constexpr (kGranularity == 0) {
    terms.scale0 = terms.scale1 = __ldg(w_scales);
  } else if constexpr (kGranularity == 1) {
    terms.scale0 = __ldg(w_scales + column);
    if (pair) terms.scale1 = __ldg(w_scales + column + 1);
  }
  if constexpr (kHasBias) {
    if (segment.bias != nullptr) {
      const __nv_bfloat16* bias = reinterpret_cast<const __nv_bfloat16*>(segment.bias);
      terms.bias0 = __bfloat162float(bias[column]);
      if (pair) terms.bias1 = __bfloat162float(bias[column + 1]);
    }
  }
  return terms;
}

// Columns n and n + 1 (`pair`: n + 1 < N) of a tile that lies in `segment` (every segment but the last is
// a whole number of tiles wide).
template <int kGranularity, bool kHasBias>
__device__ __forceinline__ Fp8ColumnPair fp8_column_pair(const GemmSegment& segment, int n, bool pair) {
  return fp8_segment_columns<kGranularity, kHasBias>(segment, n - segment.n_begin, pair);
}

// C[m, n] = accumulator0 * scale0 + bias0 (and n + 1 likewise when `pair`), rounded once to bf16: one
// 4-byte store per pair (ldc is even, n is even), columns past N untouched.
__device__ __forceinline__ void store_fp8_columns(bf16_bits* out, const Fp8ColumnPair& column,
                                                  float accumulator0, float accumulator1, bool pair) {
  const float2 value = column.apply(accumulator0, accumulator1);
  if (pair) {
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(value.x, value.y);
  } else {
    *reinterpret_cast<__nv_bfloat16*>(out) = __float2bfloat16_rn(value.x);
  }
}

}  // namespace attnplan::kernels
