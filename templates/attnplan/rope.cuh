// RoPE's rotation of one (position, pair): shared by the QKV postprocess kernel (qkv_postprocess.cuh) and
// the input norm (rmsnorm.cuh), which writes the rotation table that the q|k|v GEMM's epilogue reads
// (gemm_sm90_qkv_epilogue.cuh), so that every path turns a pair by exactly the same (cos, sin).
#pragma once

namespace attnplan::kernels {

// (cos, sin) of the angle position * frequency, each times attention_factor.
//
// The angle is formed and reduced modulo 2 pi in double: positions reach 128k and beyond and the fastest
// pair turns by 1 rad per position, so a float product near 2^17 rad would already be off by up to
// ulp(2^17) / 2 = 2^-7 rad, more than bf16's own rounding (2^-9 relative). In double the product, and the
// fraction of a turn left after removing the whole turns, err by ~1e-11 rad for positions up to millions.
// Only that fraction, in [-1/2, 1/2] turn, is rounded to float (~1e-7 rad).
// sincospif rather than sincosf on the reduced angle: sincosf cannot know its argument is small and
// carries Payne-Hanek reduction for huge ones (a local-memory stack frame and a 2/pi table in global
// memory); sincospif reduces multiples of pi exactly, with the same ~1 ulp accuracy.
__device__ __forceinline__ float2 rotation_at(long long position, double frequency, float attention_factor) {
  constexpr double kInverseTwoPi = 0.159154943091895335768883763;
  const double turns = static_cast<double>(position) * frequency * kInverseTwoPi;
  const double half_turns = 2.0 * (turns - rint(turns));  // [-1, 1]: the angle in units of pi
  float sine, cosine;
  sincospif(static_cast<float>(half_turns), &sine, &cosine);
  return make_float2(cosine * attention_factor, sine * attention_factor);
}

}  // namespace attnplan::kernels
