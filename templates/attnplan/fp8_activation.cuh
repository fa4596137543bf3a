// The activation rounding of the fp8-activation projections, on the device: gemm_sm90_fp8_params.h states
// the rule and the CPU reference repeats it (reference/fp8_activation.hpp). Shared by the quantizer
// (fp8_quantize_kernel) and the input RMSNorm that writes the q|k|v projection's codes itself
// (rmsnorm.cuh, RmsNormTraits::fp8_codes), so both write the same bits.
#pragma once

#include <cuda_fp8.h>

namespace attnplan::kernels {

// An activation group (kFp8ActivationGroup = 128 channels, gemm_sm90_fp8_params.h, which the norm's kernel
// does not include: its cache key stays off the GEMM's headers) as 16 lanes of 8 channels each: the lanes
// of one half-warp.
inline constexpr int kFp8GroupLanes = 16;
inline constexpr int kFp8ChannelsPerLane = 8;

// A lane's amax over its 8 channels.
__device__ __forceinline__ float fp8_lane_amax(const float (&values)[kFp8ChannelsPerLane]) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kFp8ChannelsPerLane; ++i) amax = fmaxf(amax, fabsf(values[i]));
  return amax;
}

// The scale of a group whose amax is `amax`: amax / 448, or 1 when it is 0. IEEE divisions (__fdiv_rn) here
// and below, whatever the compile options say about fast math: the reference repeats them.
__device__ __forceinline__ float fp8_scale_of(float amax) {
  return amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
}

// The scale of the 128-channel group whose 8 channels this lane holds (zeros for channels past the row):
// amax over the half-warp (offsets below 16 stay inside it). Every lane of the warp must call it.
__device__ __forceinline__ float fp8_activation_scale(const float (&values)[kFp8ChannelsPerLane]) {
  float amax = fp8_lane_amax(values);
#pragma unroll
  for (int offset = kFp8GroupLanes / 2; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  return fp8_scale_of(amax);
}

// A lane's 8 channels as e4m3fn codes (value / scale, round to nearest even, saturating), packed in
// channel order: one 8-byte store.
__device__ __forceinline__ uint2 fp8_activation_codes(const float (&values)[kFp8ChannelsPerLane],
                                                      float scale) {
  unsigned packed[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < kFp8ChannelsPerLane; ++i) {
    const unsigned code = static_cast<unsigned char>(
        __nv_cvt_float_to_fp8(__fdiv_rn(values[i], scale), __NV_SATFINITE, __NV_E4M3));
    packed[i / 4] |= code << (8 * (i % 4));
  }
  return make_uint2(packed[0], packed[1]);
}

}  // namespace attnplan::kernels
