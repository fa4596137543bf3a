// The fp8 e4m3fn KV cache on the device (specs/formats.md): stored k_q = fp8(k / k_scale), read
// k = k_q * k_scale. The store divides in fp32 with one IEEE rounding (__fdiv_rn, whatever the compile
// options say about fast division) and rounds to e4m3fn to nearest even, saturating to +-448
// (__NV_SATFINITE: hardware cvt.rn.satfinite on sm_89+, cuda_fp8.hpp's software rounding before) — the
// rounding of core::quantize_kv_fp8 on the host. The read widens codes to bf16 exactly (every e4m3fn value
// is a bf16); the scales stay out of the tiles and multiply fp32 scores and outputs instead.
#pragma once

#include <cuda_fp8.h>

#include "attnplan/common.cuh"

namespace attnplan::kernels {

__device__ __forceinline__ unsigned char quantize_kv_fp8(float value, float scale) {
  return static_cast<unsigned char>(
      __nv_cvt_float_to_fp8(__fdiv_rn(value, scale), __NV_SATFINITE, __NV_E4M3));
}

// N fp8 codes moved as one aligned access of N bytes.
template <int N>
struct alignas(N) Fp8Vector {
  unsigned char codes[N];
};

// One bf16 vector of a k or v row, quantized: `cache` holds 1-byte codes at the same element index.
template <int N>
__device__ __forceinline__ void store_quantized(const bf16_bits* source, long long index,
                                                unsigned char* cache, long long cache_index, float scale) {
  const BF16Vector<N> values = BF16Vector<N>::load(source, index);
  Fp8Vector<N> codes;
#pragma unroll
  for (int i = 0; i < N; ++i) codes.codes[i] = quantize_kv_fp8(__bfloat162float(values.values[i]), scale);
  *reinterpret_cast<Fp8Vector<N>*>(cache + cache_index) = codes;
}

// Two codes (low byte first) widened to a bf16 pair, low element in the low half: exact.
__device__ __forceinline__ unsigned fp8x2_to_bf16x2(unsigned short codes) {
  const __half2 halves = __half2(__nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3));  // exact: e4m3 fits f16
  const __nv_bfloat162 pair = __float22bfloat162_rn(__half22float2(halves));     // exact: e4m3 fits bf16
  return *reinterpret_cast<const unsigned*>(&pair);
}

// Eight codes (8 bytes) widened to eight bf16 (16 bytes), element order kept.
__device__ __forceinline__ uint4 fp8x8_to_bf16x8(uint2 codes) {
  return make_uint4(fp8x2_to_bf16x2(static_cast<unsigned short>(codes.x & 0xFFFFu)),
                    fp8x2_to_bf16x2(static_cast<unsigned short>(codes.x >> 16)),
                    fp8x2_to_bf16x2(static_cast<unsigned short>(codes.y & 0xFFFFu)),
                    fp8x2_to_bf16x2(static_cast<unsigned short>(codes.y >> 16)));
}

}  // namespace attnplan::kernels
