// The bf16 projection GEMM: C[M, N] = A[M, K] · W[N, K]^T (+ bias[N]), fp32 accumulation, one rounding
// to bf16. W is split along N into up to three segments with their own pointers (q_proj | k_proj | v_proj).
//
// Ampere-style tensor-core kernel that also runs on sm_89 and sm_90: each CTA computes a
// [block_m, block_n] tile of C; a `stages`-deep cp.async pipeline streams [block_m, block_k] slices of A
// and [block_n, block_k] slices of W into XOR-swizzled shared memory, and each warp multiplies its
// [warp_tile_m, warp_tile_n] sub-tile with ldmatrix + mma.sync.m16n8k16 (bf16 in, fp32 accumulators).
// Rows past M or N and columns past K are zero-filled by the copies, so any M, N and any K that is a
// multiple of 8 work. The epilogue adds the bias in fp32, rounds to bf16 once, stages the tile in shared
// memory and writes it back with 16-byte row-contiguous stores.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "attnplan/common.cuh"
#include "attnplan/gemm_params.h"

namespace attnplan::kernels {

// Weight loader policies: what the pipeline copies for W and how it becomes the bf16 B operand.
// bf16 weights are copied as they are into the swizzled stage and read by ldmatrix directly. A quantized
// policy copies the packed bytes of the [block_n, block_k] slice (cp.async, same pipeline as A), then all
// threads dequantize that stage into one bf16 [block_n, block_k] swizzled tile, from which ldmatrix reads:
// W is read once from global memory, in its packed size, and never stored dequantized outside shared
// memory. Scales are read from global memory (L1/L2 resident: one scale serves 16 to 16384 values) at
// dequantization. Each policy turns 8 consecutive K values of one W row into 8 bf16.
struct Bf16Weights {
  static constexpr int bits = 16;
};

// float from an e4m3fn byte: bias 7, no infinities, S.1111.111 is NaN, exponent 0 is m / 8 * 2^-6.
__device__ __forceinline__ float e4m3fn_to_float(unsigned byte) {
  const unsigned sign = (byte & 0x80u) << 24;
  const unsigned exponent = (byte >> 3) & 15u;
  const unsigned mantissa = byte & 7u;
  if (exponent == 15u && mantissa == 7u) return __int_as_float(0x7fc00000);
  if (exponent == 0u) return __int_as_float(sign | __float_as_uint(float(mantissa) * 0x1p-9f));
  return __int_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// 2^(e - 127) from an E8M0 byte; e = 0xFF is NaN, e = 0 the float subnormal 2^-127.
__device__ __forceinline__ float e8m0_to_float(unsigned e) {
  if (e == 0xFFu) return __int_as_float(0x7fc00000);
  return e == 0u ? __int_as_float(0x00400000) : __int_as_float(int(e << 23));
}

// For the decoding kernel (gemm_sm90_decode.cuh), which loads a slice's scale bytes well before it
// converts them: byte `index` of read-only global `bytes` into a 32-bit register as it is (ld.global.nc.u8
// zero-extends), so no instruction reads the loaded register before the conversion does (a u8 load
// through C++ leaves a zero-extension right behind it, which waits for the load).
__device__ __forceinline__ unsigned load_scale_byte(const void* bytes, long long index) {
  unsigned value;
  asm("ld.global.nc.u8 %0, [%1];" : "=r"(value) : "l"(static_cast<const unsigned char*>(bytes) + index));
  return value;
}

// e8m0_to_float with selects, not branches (the same values): the decoding kernel converts a slice's
// scales in one run, where each branch cost it a branch resolution.
__device__ __forceinline__ float e8m0_to_float_select(unsigned e) {
  const unsigned bits = e == 0u ? 0x00400000u : e << 23;
  return __uint_as_float(e == 0xFFu ? 0x7fc00000u : bits);
}

// E2M1 from the low 4 bits: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign.
__device__ __forceinline__ float e2m1_to_float(unsigned nibble) {
  const unsigned magnitude = nibble & 7u;
  // 0, .5, 1, 1.5 are m / 2; the upper half is the table's 2, 3, 4, 6.
  const float value = magnitude < 4u ? float(magnitude) * 0.5f
                                     : (magnitude == 4u   ? 2.0f
                                        : magnitude == 5u ? 3.0f
                                        : magnitude == 6u ? 4.0f
                                                          : 6.0f);
  return (nibble & 8u) != 0u ? -value : value;
}

// The two E2M1 codes of `byte` (low nibble first) as floats times 2^-14, without a branch or table: a
// code's exponent and mantissa bits placed at fp16 bits 11..9 (sign at 15) make an fp16 of exactly the
// code's value times 2^-14, E2M1's subnormal 0.5 included (the fp16 subnormal 2^-15); fp16 -> f32 is exact.
__device__ __forceinline__ float2 e2m1_pair_to_float2_scaled(unsigned byte) {
  const unsigned spread = (byte & 0xFFu) * 0x1001u;  // nibble 0 at bits 0..3, nibble 1 at bits 16..19
  const unsigned bits = ((spread & 0x00070007u) << 9) | ((spread & 0x00080008u) << 12);
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

// The two 4-bit unsigned integers of `byte` (low nibble first) as exact floats: fp16 1024 + q (q in the
// low mantissa bits of 1024's exponent), minus 1024.
__device__ __forceinline__ float2 u4_pair_to_float2(unsigned byte) {
  const unsigned spread = (byte & 0xFFu) * 0x1001u;
  const unsigned bits = (spread & 0x000F000Fu) | 0x64006400u;
  const __half2 biased = *reinterpret_cast<const __half2*>(&bits);
  return __half22float2(__hsub2(biased, __floats2half2_rn(1024.0f, 1024.0f)));
}

// The e4m3fn formats' codes for the sm_90a mixed-input kernel (gemm_sm90_w4.cuh), as E2m1Codes below for
// the 4-bit ones: bytes [rows, K] in k order; code_pair takes two codes (the low 16 bits, lower k first)
// and gives their exact values (e4m3fn fits fp16; its NaN code stays NaN, as e4m3fn_to_float says).
struct E4m3Codes {
  static constexpr bool has_offset = false;
  static constexpr float code_pair_unit = 1.0f;
  __device__ static float2 code_pair(unsigned pair) {
    return __half22float2(
        __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3)));
  }
  // The mma.sync loaders' and the dequantize kernel's decode: raw holds the 8 codes of W[row, k .. k + 8)
  // in a staged tile (8-byte aligned: the row chunks are), s their scale. From sm_89 the codes go two per
  // cvt.f16x2.e4m3x2 from one 8-byte load. Same values as e4m3fn_to_float: both are exact (e4m3fn fits
  // fp16 and fp16 fits f32), the NaN codes included (NaN either way; the product with s is then the
  // canonical NaN both ways); -0 stays -0. So each value is code * s with its one f32 rounding, as before.
  __device__ static void scale_codes(const unsigned char* raw, float s, float (&values)[8]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const uint2 codes = *reinterpret_cast<const uint2*>(raw);
    const unsigned words[2] = {codes.x, codes.y};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 pair = code_pair(words[e / 2] >> (16 * (e % 2)));
      values[2 * e] = pair.x * s;
      values[2 * e + 1] = pair.y * s;
    }
#else
    // Before sm_89 there is no fp8 conversion instruction: cuda_fp8.hpp's emulation of code_pair branches
    // and loops per code, no cheaper than e4m3fn_to_float.
#pragma unroll
    for (int e = 0; e < 8; ++e) values[e] = e4m3fn_to_float(raw[e]) * s;
#endif
  }
};

// fp8 e4m3fn weights, weight-only (activations stay bf16). kGranularity: 0 one f32 scale for the tensor,
// 1 one f32 per row, 2 one f32 per 128x128 block ([ceil(rows / 128), ceil(K / 128)]).
template <int kGranularity>
struct Fp8Weights : E4m3Codes {
  static constexpr int bits = 8;
  static_assert(kGranularity >= 0 && kGranularity <= 2, "tensor, channel or block");
  // raw: the 8 bytes of W[row, k .. k + 8) (k a multiple of 8, so one scale block holds all 8).
  __device__ static float scale(const GemmSegment& segment, int row, int k, int k_total) {
    const float* scales = static_cast<const float*>(segment.scales);
    if constexpr (kGranularity == 0) return scales[0];
    if constexpr (kGranularity == 1) return scales[row];
    return scales[(row / 128) * ((k_total + 127) / 128) + k / 128];
  }
  __device__ static void dequantize(const unsigned char* raw, const GemmSegment& segment, int row, int k,
                                    int k_total, float (&values)[8]) {
    scale_codes(raw, scale(segment, row, k, k_total), values);
  }
  // For gemm_sm90_w4.cuh: one scale per 128 k of a row (block), else one for the whole row (-1).
  static constexpr int group_size = kGranularity == 2 ? 128 : -1;
  __device__ static float group_scale(const GemmSegment& segment, int row, int group, int k_total) {
    return scale(segment, row, group * 128, k_total);  // group is 0 unless block-scaled
  }
  // For gemm_sm90_decode.cuh (see scale_code there): the scale is stored as an f32.
  using ScaleCode = float;
  __device__ static ScaleCode scale_code(const GemmSegment& segment, int row, int group, int k_total) {
    return group_scale(segment, row, group, k_total);
  }
  __device__ static float scale_value(ScaleCode code) { return code; }
};

// The OCP MX formats' scales (mxfp4, mxfp8): one E8M0 byte per 32 values of a row, [rows, K / 32].
// row: W row within the segment; group: k / group_size.
struct E8m0GroupScales {
  static constexpr int group_size = 32;
  __device__ static float group_scale(const GemmSegment& segment, int row, int group, int k_total) {
    return e8m0_to_float(static_cast<const unsigned char*>(segment.scales)[row * (k_total / 32) + group]);
  }
  using ScaleCode = unsigned;  // the E8M0 byte, for gemm_sm90_decode.cuh
  __device__ static ScaleCode scale_code(const GemmSegment& segment, int row, int group, int k_total) {
    return load_scale_byte(segment.scales, static_cast<long long>(row) * (k_total / 32) + group);
  }
  __device__ static float scale_value(ScaleCode code) { return e8m0_to_float_select(code); }
};

// OCP MXFP8: e4m3fn values, one E8M0 scale per 32 values of a row ([rows, K / 32]).
struct Mxfp8Weights : E4m3Codes, E8m0GroupScales {
  static constexpr int bits = 8;
  __device__ static void dequantize(const unsigned char* raw, const GemmSegment& segment, int row, int k,
                                    int k_total, float (&values)[8]) {
    scale_codes(raw, group_scale(segment, row, k / 32, k_total), values);
  }
};

// The 4-bit formats that store a row's codes contiguously ([rows, K / 2] bytes, low nibble = even k) also
// say, for the sm_90a mixed-input kernel (gemm_sm90_w4.cuh), how one code becomes a value: value =
// code_value(code) * group_scale(...) (+ group_offset(...) where has_offset), with one scale per
// `group_size` consecutive k of a row. The mma.sync loaders below decode through the same functions.
// code_pair(byte) is the fast form for both codes of a byte: code_value of each times code_pair_unit
// (the E2M1 loader and so the dequantize kernel decode through it).
// The row-byte formats also split group_scale into scale_code (the loads alone: the stored scale, a
// ScaleCode) and scale_value (its conversion to f32): the decoding kernel (gemm_sm90_decode.cuh) issues one
// slice's loads while it decodes the slice before, and converts them only when it needs them.

// The E2M1 formats' codes and their mma.sync loader; Format supplies group_size and group_scale (CRTP).
template <class Format>
struct E2m1Codes {
  static constexpr int bits = 4;
  static constexpr bool has_offset = false;
  static constexpr float code_pair_unit = 0x1p-14f;
  __device__ static float code_value(unsigned code) { return e2m1_to_float(code); }
  __device__ static float2 code_pair(unsigned byte) { return e2m1_pair_to_float2_scaled(byte); }
  // raw: the 4 bytes of W[row, k .. k + 8) in a staged tile (4-byte aligned: the row chunks are), decoded
  // a byte (two codes) per code_pair from one 4-byte load. Each value is code_value * s with one f32
  // rounding, as from code_value: code_pair gives code_value * 2^-14 exactly and s * 2^14 is exact (a
  // power of two, subnormal s included), so the one product is the same real number, rounded once. Only
  // |s| > FLT_MAX * 2^-14 (E8M0 exponents 241 and up) would overflow s * 2^14: there the codes take s
  // unscaled (code * 2^-14 * s is then >= 2^99 unless code is 0 or s infinite: rounded as code * s, at
  // 2^-14 of its size) and the 2^14 after, exact up to the overflow that code * s meets too. A NaN s
  // gives NaN either way. (The wgmma_w4 kernel folds 2^14 into its scales unguarded: gemm_sm90_w4.cuh.)
  __device__ static void dequantize(const unsigned char* raw, const GemmSegment& segment, int row, int k,
                                    int k_total, float (&values)[8]) {
    constexpr float kUnitScale = 1.0f / code_pair_unit;              // 2^14
    constexpr float kMaxFolded = 0x1.fffffep+127f * code_pair_unit;  // FLT_MAX * 2^-14, exact
    const float s = Format::group_scale(segment, row, k / Format::group_size, k_total);
    const bool folds = !(fabsf(s) > kMaxFolded);  // NaN folds
    const float unit_scale = folds ? s * kUnitScale : s;
    const unsigned codes = *reinterpret_cast<const unsigned*>(raw);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 pair = code_pair(codes >> (8 * e));
      values[2 * e] = pair.x * unit_scale;
      values[2 * e + 1] = pair.y * unit_scale;
    }
    if (!folds) {
#pragma unroll
      for (int e = 0; e < 8; ++e) values[e] *= kUnitScale;
    }
  }
};

// OCP MXFP4: E2M1 pairs per byte (low nibble = even k), one E8M0 scale per 32 values ([rows, K / 32]).
struct Mxfp4Weights : E2m1Codes<Mxfp4Weights>, E8m0GroupScales {};

// NVFP4 (ModelOpt): E2M1 pairs, one e4m3fn scale per 16 values ([rows, K / 16]) times the f32 scale_2.
struct Nvfp4Weights : E2m1Codes<Nvfp4Weights> {
  static constexpr int group_size = 16;
  struct ScaleCode {
    unsigned e4m3;  // the group's byte
    float scale_2;  // the segment's
  };
  __device__ static ScaleCode scale_code(const GemmSegment& segment, int row, int group, int k_total) {
    return {load_scale_byte(segment.scales, static_cast<long long>(row) * (k_total / 16) + group),
            segment.scale_2[0]};
  }
  // From sm_89 one cvt (e4m3 -> f16 is exact, as is f16 -> f32), not e4m3fn_to_float's branches.
  __device__ static float scale_value(ScaleCode code) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const __half value(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code.e4m3), __NV_E4M3));
    return __half2float(value) * code.scale_2;
#else
    return e4m3fn_to_float(code.e4m3) * code.scale_2;
#endif
  }
  // Not scale_value(scale_code(...)): the other kernels keep their code.
  __device__ static float group_scale(const GemmSegment& segment, int row, int group, int k_total) {
    return e4m3fn_to_float(static_cast<const unsigned char*>(segment.scales)[row * (k_total / 16) + group]) *
           segment.scale_2[0];
  }
};

// Two codes of one weight row (one byte, low nibble = the lower k; 8-bit: the low 16 bits) -> a bf16 pair,
// lower k in the low half (the wgmma A fragment order, and k order in a row of W). scale: the row's group
// scale divided by Format::code_pair_unit (exact: a power of two); offset: the affine offset. One rounding,
// to bf16. The sm_90a kernels that decode codes (gemm_sm90_w4.cuh, gemm_sm90_decode.cuh) share it.
template <class Format>
__device__ __forceinline__ unsigned dequantize_code_pair(unsigned byte, float scale, float offset) {
  const float2 codes = Format::code_pair(byte);
  float low, high;
  if constexpr (Format::has_offset) {
    low = fmaf(codes.x, scale, offset);
    high = fmaf(codes.y, scale, offset);
  } else {
    (void)offset;
    low = codes.x * scale;
    high = codes.y * scale;
  }
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const unsigned*>(&pair);
}

// Word-copied formats. Their packed [block_n, block_k] slice is no array of 16-byte row chunks: GPTQ and AWQ
// store W transposed ([K, N], packed along K or N), and MLX rows of 3, 5 or 6 bits are not 16 bytes per K
// tile. The pipeline copies such a slice as a tile of 32-bit words, [tile_rows, tile_columns], each word
// from one segment (segment widths are multiples of 8, GemmSpec::check); `locate` gives the logical W row
// n that selects the word's segment and whether the word lies inside K, `word_index` its index in the
// segment's tensor. Scales (and MLX biases) are f32 on the device (the host widens f16 / bf16).

// Scale of W row `row` (within its segment) in group `group` where scales are [groups, N] f32 (GPTQ, AWQ).
__device__ __forceinline__ float group_major_scale(const GemmSegment& segment, int row, int group) {
  const int width = segment.n_end - segment.n_begin;
  return static_cast<const float*>(segment.scales)[static_cast<long long>(group) * width + row];
}

// GPTQ: qweight i32 [K / P, N] (P = 32 / bits values per word, row k of W^T at bits (k % P) * bits of word
// k / P), qzeros i32 [groups, N / P] packed along N, scales [groups, N]; value s * (q - (z + 1)), gptq_v2
// drops the +1. kGroupSize -1: one group (per channel). kActOrder: the group of k is g_idx[k].
template <int kBits, bool kV2, int kGroupSize, bool kActOrder>
struct GptqWeights {
  static constexpr int bits = kBits;
  static constexpr bool word_copied = true;
  static constexpr bool act_order = kActOrder;  // dequantize gathers a scale and a zero per k
  static constexpr int per_word = 32 / kBits;
  static_assert(kBits == 4 || kBits == 8, "GPTQ packs 4 or 8 bits");
  static_assert(kGroupSize == -1 || kGroupSize % 8 == 0, "8 consecutive k share a group");
  template <int kBlockN, int kBlockK>
  static constexpr int tile_rows = kBlockK / per_word;  // word rows of qweight per K tile
  template <int kBlockN, int kBlockK>
  static constexpr int tile_columns = kBlockN;  // one word per W row n
  template <int kBlockN, int kBlockK>
  __device__ static void locate(int r, int c, int n0, int k_offset, int k_total, int& n, bool& in_k) {
    n = n0 + c;
    in_k = k_offset + r * per_word < k_total;
  }
  template <int kBlockN, int kBlockK>
  __device__ static long long word_index(int r, int c, int k_offset, int row_in_segment, int width, int) {
    return static_cast<long long>(k_offset / per_word + r) * width + row_in_segment;
  }
  // Scale and zero point (with v1's + 1) of W row `row` of the segment in group `group`.
  __device__ static float group_scale(const GemmSegment& segment, int row, int group, int /*k_total*/) {
    return group_major_scale(segment, row, group);
  }
  __device__ static float zero_point(const GemmSegment& segment, int row, int group) {
    const int width = segment.n_end - segment.n_begin;
    const unsigned word = static_cast<const unsigned*>(
        segment.zeros)[static_cast<long long>(group) * (width / per_word) + row / per_word];
    return float((word >> (kBits * (row % per_word))) & ((1u << kBits) - 1u)) + (kV2 ? 0.0f : 1.0f);
  }
  // words: the stage's tile; n: W row in the segment, tile_row: its row in the tile; kk: k - k_offset.
  template <int kBlockN, int kBlockK>
  __device__ static void dequantize(const unsigned* words, int tile_row, int kk, const GemmSegment& segment,
                                    int n, int k, int k_total, float (&values)[8]) {
    constexpr unsigned mask = (1u << kBits) - 1u;
    int g = kGroupSize > 0 ? k / kGroupSize : 0;
    float s = group_scale(segment, n, g, k_total);
    float z = zero_point(segment, n, g);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const unsigned word = words[((kk + e) / per_word) * kBlockN + tile_row];
      const unsigned q = (word >> (kBits * ((kk + e) % per_word))) & mask;
      if constexpr (kActOrder) {
        g = segment.g_idx[k + e];
        s = group_scale(segment, n, g, k_total);
        z = zero_point(segment, n, g);
      }
      values[e] = s * (float(q) - z);
    }
  }

  // For the sm_90a kernels (gemm_sm90_w4.cuh, gemm_sm90_decode.cuh; 4 bits, no act order): the codes are
  // 32-bit words [K / 8, rows] (k_major_words), a byte of a word holds two consecutive k (low nibble first),
  // and a value is q * s + offset with offset = -s * z.
  static constexpr int group_size = kGroupSize;  // -1: one group (per channel)
  static constexpr bool k_major_words = true;
  static constexpr bool has_offset = true;
  static constexpr float code_pair_unit = 1.0f;
  using ScaleCode = float;  // for gemm_sm90_decode.cuh (see scale_code there)
  __device__ static ScaleCode scale_code(const GemmSegment& segment, int row, int group, int k_total) {
    return group_scale(segment, row, group, k_total);
  }
  __device__ static float scale_value(ScaleCode code) {
    return code;
  }
  // The offset split like the scale: the qzeros word that holds `row`'s zero point (loaded a slice ahead),
  // then -s * z from it once the loads have landed (group_offset's value).
  using OffsetCode = unsigned;
  __device__ static OffsetCode offset_code(const GemmSegment& segment, int row, int group, int /*k_total*/) {
    const int width = segment.n_end - segment.n_begin;
    return static_cast<const unsigned*>(
        segment.zeros)[static_cast<long long>(group) * (width / per_word) + row / per_word];
  }
  __device__ static float offset_value(OffsetCode word, float scale, int row) {
    constexpr unsigned mask = (1u << kBits) - 1u;
    return -scale * (float((word >> (kBits * (row % per_word))) & mask) + (kV2 ? 0.0f : 1.0f));
  }
  __device__ static float2 code_pair(unsigned byte) {
    static_assert(kBits == 4 && !kActOrder, "code pairs: 4-bit codes in k order");
    return u4_pair_to_float2(byte);
  }
  __device__ static float group_offset(const GemmSegment& segment, int row, int group, int k_total) {
    return -group_scale(segment, row, group, k_total) * zero_point(segment, row, group);
  }
};

// AWQ: qweight i32 [K, N / 8] packed along N, nibble i of a word holding column 8c + {0,2,4,6,1,3,5,7}[i];
// qzeros i32 [groups, N / 8] in the same order, scales [groups, N]; value (q - z) * s.
template <int kGroupSize>
struct AwqWeights {
  static constexpr int bits = 4;
  static constexpr bool word_copied = true;
  static_assert(kGroupSize == -1 || kGroupSize % 8 == 0, "8 consecutive k share a group");
  template <int kBlockN, int kBlockK>
  static constexpr int tile_rows = kBlockK;  // one word row per k
  template <int kBlockN, int kBlockK>
  static constexpr int tile_columns = kBlockN / 8;
  template <int kBlockN, int kBlockK>
  __device__ static void locate(int r, int c, int n0, int k_offset, int k_total, int& n, bool& in_k) {
    n = n0 + 8 * c;
    in_k = k_offset + r < k_total;
  }
  template <int kBlockN, int kBlockK>
  __device__ static long long word_index(int r, int, int k_offset, int row_in_segment, int width, int) {
    return static_cast<long long>(k_offset + r) * (width / 8) + row_in_segment / 8;
  }
  // The nibble of column offset j (the inverse of the packing order).
  __device__ static int nibble_of_column(int j) { return (j % 2) * 4 + j / 2; }
  // Zero point of W row `row` of the segment in group `group`: qzeros [groups, N / 8] in the same order.
  // The qzeros word that holds W row `row` of the segment (rows 8 (row / 8) .. + 7) in group `group`.
  __device__ static unsigned zero_word(const GemmSegment& segment, int row, int group) {
    const int width = segment.n_end - segment.n_begin;
    return static_cast<const unsigned*>(segment.zeros)[static_cast<long long>(group) * (width / 8) + row / 8];
  }
  __device__ static float zero_point(const GemmSegment& segment, int row, int group) {
    return float((zero_word(segment, row, group) >> (4 * nibble_of_column(row % 8))) & 15u);
  }
  template <int kBlockN, int kBlockK>
  __device__ static void dequantize(const unsigned* words, int tile_row, int kk, const GemmSegment& segment,
                                    int n, int k, int k_total, float (&values)[8]) {
    // Written out rather than through group_major_scale / zero_point: this is the form verified on the
    // H200, and the helpers compile to a reordered instruction (tools/ptx_diff.py).
    const int width = segment.n_end - segment.n_begin;
    const int g = kGroupSize > 0 ? k / kGroupSize : 0;
    const int shift = 4 * nibble_of_column(n % 8);
    const float s = static_cast<const float*>(segment.scales)[static_cast<long long>(g) * width + n];
    const unsigned zero_word =
        static_cast<const unsigned*>(segment.zeros)[static_cast<long long>(g) * (width / 8) + n / 8];
    const float z = float((zero_word >> shift) & 15u);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const unsigned word = words[(kk + e) * (kBlockN / 8) + tile_row / 8];
      values[e] = (float((word >> shift) & 15u) - z) * s;
    }
  }

  // For the sm_90a kernel (gemm_sm90_w4.cuh): the codes are 32-bit words [K, rows / 8] (n_major_words),
  // row r's code of a k at nibble nibble_of_column(r % 8) of word r / 8; a value is q * s + offset with
  // offset = -s * z.
  static constexpr int group_size = kGroupSize;  // -1: one group (per channel)
  static constexpr bool n_major_words = true;
  static constexpr bool has_offset = true;
  static constexpr float code_pair_unit = 1.0f;
  __device__ static float2 code_pair(unsigned byte) {
    return u4_pair_to_float2(byte);
  }
  __device__ static float group_scale(const GemmSegment& segment, int row, int group, int /*k_total*/) {
    return group_major_scale(segment, row, group);
  }
  __device__ static float group_offset(const GemmSegment& segment, int row, int group, int /*k_total*/) {
    return -group_major_scale(segment, row, group) * zero_point(segment, row, group);
  }
};

// MLX affine: weight u32 [N, K * bits / 32], per row an LSB-first bit stream over little-endian bytes;
// scales and biases [N, K / group]; value s * q + b. 8 values (k a multiple of 8) are exactly `bits`
// whole bytes of the stream, so a run never needs the bits of a neighbouring word pair.
template <int kBits, int kGroupSize>
struct AffineWeights {
  static constexpr int bits = kBits;
  static constexpr bool word_copied = true;
  static_assert(kBits >= 2 && kBits <= 8 && kBits != 7, "MLX widths 2, 3, 4, 5, 6, 8");
  static_assert(kGroupSize == 32 || kGroupSize == 64 || kGroupSize == 128, "MLX groups 32, 64, 128");
  static constexpr int group_size = kGroupSize;
  static constexpr bool has_offset = true;
  static constexpr float code_pair_unit = 1.0f;
  __device__ static float code_value(unsigned code) { return float(code); }
  // 4-bit only (the sm_90a kernel's width).
  __device__ static float2 code_pair(unsigned byte) {
    static_assert(kBits == 4, "code pairs are two 4-bit codes of one byte");
    return u4_pair_to_float2(byte);
  }
  // row: W row within the segment; group: k / group_size. Scales and biases are f32 [rows, K / group].
  __device__ static float group_scale(const GemmSegment& segment, int row, int group, int k_total) {
    return static_cast<const float*>(
        segment.scales)[static_cast<long long>(row) * (k_total / kGroupSize) + group];
  }
  using ScaleCode = float;  // for gemm_sm90_decode.cuh (see scale_code there)
  __device__ static ScaleCode scale_code(const GemmSegment& segment, int row, int group, int k_total) {
    return group_scale(segment, row, group, k_total);
  }
  __device__ static float scale_value(ScaleCode code) { return code; }
  __device__ static float group_offset(const GemmSegment& segment, int row, int group, int k_total) {
    return static_cast<const float*>(
        segment.zeros)[static_cast<long long>(row) * (k_total / kGroupSize) + group];
  }
  // The offset split like the scale (see scale_code): the stored bias, used as it is.
  using OffsetCode = float;
  __device__ static OffsetCode offset_code(const GemmSegment& segment, int row, int group, int k_total) {
    return group_offset(segment, row, group, k_total);
  }
  __device__ static float offset_value(OffsetCode code, float /*scale*/, int /*row*/) { return code; }
  template <int kBlockN, int kBlockK>
  static constexpr int tile_rows = kBlockN;
  template <int kBlockN, int kBlockK>
  static constexpr int tile_columns = kBlockK* kBits / 32;  // words of one row's K tile
  template <int kBlockN, int kBlockK>
  __device__ static void locate(int r, int c, int n0, int k_offset, int k_total, int& n, bool& in_k) {
    static_assert(kBlockK % 32 == 0, "a K tile of a row must be whole words at any width");
    n = n0 + r;
    in_k = k_offset * kBits / 32 + c < k_total * kBits / 32;
  }
  template <int kBlockN, int kBlockK>
  __device__ static long long word_index(int, int c, int k_offset, int row_in_segment, int, int k_total) {
    return static_cast<long long>(row_in_segment) * (k_total * kBits / 32) + k_offset * kBits / 32 + c;
  }
  template <int kBlockN, int kBlockK>
  __device__ static void dequantize(const unsigned* words, int tile_row, int kk, const GemmSegment& segment,
                                    int n, int k, int k_total, float (&values)[8]) {
    const unsigned char* bytes =
        reinterpret_cast<const unsigned char*>(words) + tile_row * (kBlockK * kBits / 8) + kk * kBits / 8;
    unsigned long long stream = 0;
#pragma unroll
    for (int b = 0; b < kBits; ++b) stream |= static_cast<unsigned long long>(bytes[b]) << (8 * b);
    const float s = group_scale(segment, n, k / kGroupSize, k_total);
    const float bias = group_offset(segment, n, k / kGroupSize, k_total);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const unsigned q = static_cast<unsigned>(stream >> (kBits * e)) & ((1u << kBits) - 1u);
      values[e] = s * code_value(q) + bias;
    }
  }
};

// Whether a policy's packed slice is copied as 32-bit words (above) or as 16-byte row chunks.
template <class Policy>
inline constexpr bool word_copied_v = requires {
  Policy::word_copied;
};

// Whether a policy looks up each k's group (GPTQ with act order), rather than one group per 8 k.
template <class Policy>
inline constexpr bool gathers_groups_v = requires {
  requires Policy::act_order;
};

template <int kBlockM, int kBlockN, int kBlockK, int kWarpsM, int kWarpsN, int kStages, int kSegments,
          bool kHasBias, class WeightPolicy = Bf16Weights>
struct GemmTraits {
  using Params = GemmParams;
  static constexpr int block_m = kBlockM;  // rows of C per CTA
  static constexpr int block_n = kBlockN;  // columns of C per CTA
  static constexpr int block_k = kBlockK;  // K per pipeline stage
  static constexpr int warps_m = kWarpsM;
  static constexpr int warps_n = kWarpsN;
  static constexpr int stages = kStages;
  static constexpr int segments = kSegments;
  static constexpr bool has_bias = kHasBias;
  using Weights = WeightPolicy;
  static constexpr int weight_bits = WeightPolicy::bits;
  static constexpr bool quantized = weight_bits < 16;
  static constexpr bool word_copied = word_copied_v<WeightPolicy>;

  static constexpr int warps = kWarpsM * kWarpsN;
  static constexpr int threads = 32 * warps;
  static constexpr int warp_tile_m = kBlockM / kWarpsM;  // C rows one warp owns
  static constexpr int warp_tile_n = kBlockN / kWarpsN;  // C columns one warp owns
  static constexpr int mma_tiles_m = warp_tile_m / 16;   // m16n8k16 accumulator tiles per warp along M
  static constexpr int mma_tiles_n = warp_tile_n / 8;    // ... along N
  static constexpr int k_steps = kBlockK / 16;           // k16 mma steps per stage

  // Global -> shared copies: 16-byte chunks (8 bf16 of K); a row of a stage tile is chunks_per_row chunks.
  static constexpr int chunks_per_row = kBlockK / 8;
  static constexpr int rows_per_pass = threads / chunks_per_row;  // stage rows one sweep of the CTA covers
  static constexpr int a_rows_per_thread = kBlockM / rows_per_pass;
  static constexpr int b_rows_per_thread = kBlockN / rows_per_pass;

  // Dynamic shared memory: the pipeline, later reused as the bf16 staging tile of the epilogue.
  static constexpr int a_stage_bytes = kBlockM * kBlockK * 2;  // [block_m, block_k] bf16, swizzled
  // [block_n, block_k] bf16, swizzled; quantized: [block_n, block_k * bits / 8] packed bytes, row-major.
  static constexpr int b_stage_bytes = kBlockN * kBlockK * weight_bits / 8;
  static constexpr int stage_bytes = a_stage_bytes + b_stage_bytes;
  // Quantized: the bf16 [block_n, block_k] swizzled tile the packed stage is dequantized into.
  static constexpr int dequantized_bytes = quantized ? kBlockN * kBlockK * 2 : 0;
  static constexpr int pipeline_bytes = kStages * stage_bytes + dequantized_bytes;
  // Quantized copies: 16-byte chunks of a packed stage row (copy_packed_slice).
  static constexpr int packed_chunks_per_row = kBlockK * weight_bits / 8 / 16;
  static constexpr int staging_row_elements = kBlockN + 8;  // +16 bytes: fragment writes hit distinct banks
  static constexpr int staging_bytes = kBlockM * staging_row_elements * 2;  // [block_m, block_n + 8] bf16
  static constexpr int dynamic_shared_bytes =
      gemm_dynamic_shared_bytes(kBlockM, kBlockN, kBlockK, kStages, weight_bits);
  static constexpr int output_vectors_per_row = kBlockN / 8;  // 16-byte stores per C row of the tile

  // CTAs walk the tiles in groups of this many tile rows (see grouped_tile).
  static constexpr int group_m = 8;

  static_assert(kWarpsM > 0 && kWarpsN > 0 && threads <= 1024, "1 to 32 warps");
  static_assert(kBlockM % (16 * kWarpsM) == 0, "a warp's rows must be whole m16 tiles");
  static_assert(kBlockN % (16 * kWarpsN) == 0,
                "a warp's columns must be whole pairs of n8 tiles (ldmatrix.x4)");
  static_assert(kBlockK % 16 == 0 && kBlockK <= 64, "block_k must be 16, 32, 48 or 64");
  static_assert(8 % chunks_per_row == 0, "the swizzle needs 1, 2, 4 or 8 chunks per stage row");
  static_assert(threads % chunks_per_row == 0, "every thread copies the same chunk column");
  static_assert(kBlockM % rows_per_pass == 0 && kBlockN % rows_per_pass == 0,
                "every thread copies the same number of chunks per stage");
  static_assert(kStages >= 2, "the pipeline needs at least two stages");
  static_assert(kSegments >= 1 && kSegments <= kMaxGemmSegments, "1 to 3 weight segments");
  static_assert(dynamic_shared_bytes >= pipeline_bytes && dynamic_shared_bytes >= staging_bytes,
                "the pipeline and the staging tile share the dynamic shared memory");
  static_assert(dynamic_shared_bytes <= 227 * 1024, "more shared memory than any supported SM has");
  static_assert(weight_bits == 16 || weight_bits == 8 || weight_bits == 4 || word_copied,
                "bf16, 8-bit or 4-bit weights, or a word-copied format");
  static_assert(!quantized || word_copied || packed_chunks_per_row >= 1,
                "a packed stage row must be whole 16-byte chunks");
  static_assert((kBlockN * kBlockK * weight_bits / 8) % 16 == 0, "stages stay 16-byte aligned");
};

// Shared-memory byte offset of 16-byte chunk `chunk` of row `row` in a stage tile of kChunksPerRow chunks
// per row. One ldmatrix 8x8 matrix reads the same chunk of 8 consecutive rows; without the XOR those rows
// would hit only 8 / rows_per_line distinct 16-byte bank groups. XOR-ing the chunk with the row's index
// among the lines of its 8-row group spreads them over all 8 (rows_per_line * kChunksPerRow == 8).
template <int kChunksPerRow>
__device__ __forceinline__ unsigned swizzled_offset(int row, int chunk) {
  constexpr int rows_per_line = 8 / kChunksPerRow;  // rows sharing one 128-byte line of the 32 banks
  return static_cast<unsigned>(row * kChunksPerRow + (chunk ^ ((row % 8) / rows_per_line))) * 16u;
}

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, bypassing L1; copies `source_bytes` (16 or 0) and zero-fills the rest.
__device__ __forceinline__ void cp_async_16(unsigned destination, const void* source, int source_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(source),
               "r"(source_bytes)
               : "memory");
}

// 4 bytes global -> shared (through L1: neighbouring words of one tile row share lines); copies
// `source_bytes` (4 or 0) and zero-fills the rest.
__device__ __forceinline__ void cp_async_4(unsigned destination, const void* source, int source_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(destination), "l"(source),
               "r"(source_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 bf16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i, and
// each lane receives, per matrix, the two elements at (row lane / 4, columns 2 * (lane % 4) + {0, 1}).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&fragment)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(address));
}

// accumulator[16x8] += a[16x16] · b[16x8]; fragments in the m16n8k16 register layouts.
__device__ __forceinline__ void mma_m16n8k16(float (&accumulator)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The segment that holds logical weight row `n` (a column of C). Selected with compile-time indices
// only: indexing the Params array with a run-time value would copy it to local memory.
template <int kSegments>
__device__ __forceinline__ GemmSegment segment_of(const GemmParams& params, int n) {
  GemmSegment segment = params.segments[0];
#pragma unroll
  for (int s = 1; s < kSegments; ++s) {
    if (n >= params.segments[s].n_begin) segment = params.segments[s];
  }
  return segment;
}

// bias[n] as fp32; 0 past N or on a segment without bias.
template <int kSegments>
__device__ __forceinline__ float bias_of(const GemmParams& params, int n) {
  if (n >= params.n) return 0.0f;
  const GemmSegment segment = segment_of<kSegments>(params, n);
  if (segment.bias == nullptr) return 0.0f;
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(segment.bias)[n - segment.n_begin]);
}

// Queues (cp.async, not committed) the copy of one packed W slice, weight rows [n0, n0 + kRows) by K
// [k_offset, k_offset + kBlockK), to shared memory at `destination`, laid out as the mma.sync GEMM's stages
// and the dequantize kernel's tile read it: a word-copied policy's [tile_rows, tile_columns] word tile, or
// kRows rows of 16-byte chunks (chunk c of row r: bytes [16 c, 16 c + 16) of W row n0 + r's slice, i.e. K
// values [k_offset + c * 128 / bits, ...); K is a multiple of 128 / bits (GemmSpec::check), so a chunk is
// wholly inside K or wholly outside). Words or chunks past N or K read nothing (from `fallback`, any valid
// global address) and land as zeros.
template <class Weights, int kRows, int kBlockK, int kSegments, int kThreads>
__device__ __forceinline__ void copy_packed_slice(unsigned destination, const GemmParams& params, int n0,
                                                  int k_offset, const void* fallback) {
  if constexpr (word_copied_v<Weights>) {
    constexpr int kColumns = Weights::template tile_columns<kRows, kBlockK>;
    constexpr int kWords = Weights::template tile_rows<kRows, kBlockK> * kColumns;
    for (int v = threadIdx.x; v < kWords; v += kThreads) {
      const int r = v / kColumns;
      const int c = v % kColumns;
      int n;
      bool in_k;
      Weights::template locate<kRows, kBlockK>(r, c, n0, k_offset, params.k, n, in_k);
      const bool copy = n < params.n && in_k;
      const GemmSegment segment = segment_of<kSegments>(params, copy ? n : 0);
      const unsigned* source =
          reinterpret_cast<const unsigned*>(segment.weight) +
          (copy ? Weights::template word_index<kRows, kBlockK>(r, c, k_offset, n - segment.n_begin,
                                                               segment.n_end - segment.n_begin, params.k)
                : 0);
      cp_async_4(destination + static_cast<unsigned>(v) * 4u,
                 copy ? static_cast<const void*>(source) : fallback, copy ? 4 : 0);
    }
  } else {
    constexpr int kChunksPerRow = kBlockK * Weights::bits / 8 / 16;
    constexpr int kValuesPerChunk = 128 / Weights::bits;
    const long long row_bytes = static_cast<long long>(params.k) * Weights::bits / 8;
    for (int v = threadIdx.x; v < kRows * kChunksPerRow; v += kThreads) {
      const int row = v / kChunksPerRow;
      const int chunk = v % kChunksPerRow;
      const int n = n0 + row;
      const int k = k_offset + chunk * kValuesPerChunk;
      const bool copy = n < params.n && k < params.k;
      const GemmSegment segment = segment_of<kSegments>(params, copy ? n : 0);
      const unsigned char* source = reinterpret_cast<const unsigned char*>(segment.weight) +
                                    (copy ? (n - segment.n_begin) * row_bytes + k * Weights::bits / 8 : 0);
      cp_async_16(destination + static_cast<unsigned>(v) * 16u,
                  copy ? static_cast<const void*>(source) : fallback, copy ? 16 : 0);
    }
  }
}

struct TileCoordinates {
  int m;  // tile row: C rows [m * block_m, (m + 1) * block_m)
  int n;  // tile column
};

// The tile of linear CTA index `block`. CTAs go down a group of kGroupM tile rows column by column, so
// the CTAs resident at one time share a few A row panels and a few W column panels in L2, instead of
// sharing one A panel and streaming all of W.
template <int kGroupM>
__device__ __forceinline__ TileCoordinates grouped_tile(int block, int tiles_m, int tiles_n) {
  const int tiles_per_group = kGroupM * tiles_n;
  const int first_m = block / tiles_per_group * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  const int within = block % tiles_per_group;
  return {first_m + within % group_rows, within / group_rows};
}

// The tiles of C a persistent sm_90a GEMM CTA walks. With clusters of kClusterM CTAs along M the unit of work
// is a column of kClusterM vertically adjacent tiles (grouped order over units), cluster rank r taking its
// row r; a cluster walks units blockIdx.x / kClusterM, + gridDim.x / kClusterM, ... Without clusters this is
// grouped_tile over single tiles, strided by the grid.
template <int kClusterM, int kGroupM>
struct TileWalk {
  int tiles_m, tiles_n;
  unsigned rank;  // in the cluster

  __device__ __forceinline__ int unit_rows() const { return (tiles_m + kClusterM - 1) / kClusterM; }
  __device__ __forceinline__ int units() const { return unit_rows() * tiles_n; }
  __device__ __forceinline__ static int first() { return blockIdx.x / kClusterM; }
  __device__ __forceinline__ static int stride() { return gridDim.x / kClusterM; }
  __device__ __forceinline__ TileCoordinates tile(int unit) const {
    TileCoordinates coordinates = grouped_tile<kGroupM / kClusterM>(unit, unit_rows(), tiles_n);
    coordinates.m = coordinates.m * kClusterM + static_cast<int>(rank);
    return coordinates;
  }
};

// grid: [ceil(M / block_m) * ceil(N / block_n)], block: [Traits::threads],
// dynamic shared memory: Traits::dynamic_shared_bytes
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) gemm_kernel(const GemmParams params) {
  constexpr int kChunks = Traits::chunks_per_row;
  extern __shared__ __align__(128) unsigned char shared[];
  const unsigned shared_base = shared_address(shared);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;

  const int tiles_m = (params.m + Traits::block_m - 1) / Traits::block_m;
  const int tiles_n = (params.n + Traits::block_n - 1) / Traits::block_n;
  const TileCoordinates tile = grouped_tile<Traits::group_m>(blockIdx.x, tiles_m, tiles_n);
  const int m0 = tile.m * Traits::block_m;
  const int n0 = tile.n * Traits::block_n;

  // Each thread copies chunk `copy_chunk` (K elements [8 * copy_chunk, 8 * copy_chunk + 8) of the stage)
  // of stage rows copy_row + i * rows_per_pass, for A and for W. Sources are resolved once: row pointers
  // (segment lookup included) then only advance along K.
  const int copy_chunk = threadIdx.x % kChunks;
  const int copy_row = threadIdx.x / kChunks;
  const bf16_bits* a_source[Traits::a_rows_per_thread];  // &A[m0 + row, 8 * copy_chunk]
  bool a_in_bounds[Traits::a_rows_per_thread];
#pragma unroll
  for (int i = 0; i < Traits::a_rows_per_thread; ++i) {
    const int m = m0 + copy_row + i * Traits::rows_per_pass;
    a_in_bounds[i] = m < params.m;
    a_source[i] = params.a + (a_in_bounds[i] ? m : 0) * params.lda + copy_chunk * 8;
  }
  const bf16_bits* b_source[Traits::b_rows_per_thread];  // &W_segment[n0 + row - n_begin, 8 * copy_chunk]
  bool b_in_bounds[Traits::b_rows_per_thread];
#pragma unroll
  for (int i = 0; i < Traits::b_rows_per_thread; ++i) {
    const int n = n0 + copy_row + i * Traits::rows_per_pass;
    b_in_bounds[i] = n < params.n;
    const GemmSegment segment = segment_of<Traits::segments>(params, b_in_bounds[i] ? n : 0);
    const int row_in_segment = b_in_bounds[i] ? n - segment.n_begin : 0;
    b_source[i] = segment.weight + static_cast<long long>(row_in_segment) * params.k + copy_chunk * 8;
  }

  // Queues the copies of K tile `k_tile` into its stage. Chunks past M, N or K read nothing and land as
  // zeros (K is a multiple of 8, so a chunk is either wholly inside K or wholly outside).
  auto load_stage = [&](int k_tile) {
    const unsigned a_stage = shared_base + (k_tile % Traits::stages) * Traits::stage_bytes;
    const unsigned b_stage = a_stage + Traits::a_stage_bytes;
    const int k_offset = k_tile * Traits::block_k;
    const bool k_in_bounds = k_offset + copy_chunk * 8 < params.k;
#pragma unroll
    for (int i = 0; i < Traits::a_rows_per_thread; ++i) {
      const bool copy = a_in_bounds[i] && k_in_bounds;
      cp_async_16(a_stage + swizzled_offset<kChunks>(copy_row + i * Traits::rows_per_pass, copy_chunk),
                  copy ? a_source[i] + k_offset : params.a, copy ? 16 : 0);
    }
    if constexpr (!Traits::quantized) {
#pragma unroll
      for (int i = 0; i < Traits::b_rows_per_thread; ++i) {
        const bool copy = b_in_bounds[i] && k_in_bounds;
        cp_async_16(b_stage + swizzled_offset<kChunks>(copy_row + i * Traits::rows_per_pass, copy_chunk),
                    copy ? b_source[i] + k_offset : params.a, copy ? 16 : 0);
      }
    } else {
      // The packed slice (words or 16-byte row chunks); past N or K nothing is read and zeros land.
      copy_packed_slice<typename Traits::Weights, Traits::block_n, Traits::block_k, Traits::segments,
                        Traits::threads>(b_stage, params, n0, k_offset, params.a);
    }
  };

  // Quantized: packed stage `k_tile` -> the bf16 tile, 8 K values (one 16-byte swizzled chunk) per step.
  // Rows past N and values past K become zeros (their scales are never read).
  auto dequantize_stage = [&](int k_tile) {
    const unsigned char* packed =
        shared + (k_tile % Traits::stages) * Traits::stage_bytes + Traits::a_stage_bytes;
    unsigned char* tile = shared + Traits::stages * Traits::stage_bytes;  // [block_n, block_k] bf16
    constexpr int kTileChunks = Traits::block_n * kChunks;
    for (int v = threadIdx.x; v < kTileChunks; v += Traits::threads) {
      const int row = v / kChunks;
      const int chunk = v % kChunks;
      const int n = n0 + row;
      const int k = k_tile * Traits::block_k + chunk * 8;
      float values[8] = {};
      if (n < params.n && k < params.k) {
        const GemmSegment segment = segment_of<Traits::segments>(params, n);
        if constexpr (Traits::word_copied) {
          Traits::Weights::template dequantize<Traits::block_n, Traits::block_k>(
              reinterpret_cast<const unsigned*>(packed), row, chunk * 8, segment, n - segment.n_begin, k,
              params.k, values);
        } else if constexpr (Traits::quantized) {  // bf16 has no dequantize (and never calls this lambda)
          const unsigned char* raw = packed + row * (Traits::block_k * Traits::weight_bits / 8) +
                                     chunk * 8 * Traits::weight_bits / 8;
          Traits::Weights::dequantize(raw, segment, n - segment.n_begin, k, params.k, values);
        }
      }
      // Pairs packed through their bits: no local array reinterpreted as a 16-byte vector.
      unsigned pairs[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(values[2 * e], values[2 * e + 1]);
        pairs[e] = *reinterpret_cast<const unsigned*>(&pair);
      }
      *reinterpret_cast<uint4*>(tile + swizzled_offset<kChunks>(row, chunk)) =
          make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
  };

  const int k_tiles = (params.k + Traits::block_k - 1) / Traits::block_k;
  // Prologue: stages - 1 tiles in flight. Every thread commits one group per tile slot, empty or not,
  // so that wait_group counts stay uniform.
#pragma unroll
  for (int s = 0; s < Traits::stages - 1; ++s) {
    if (s < k_tiles) load_stage(s);
    cp_async_commit();
  }

  // This warp's sub-tile of C: rows [warp_row, warp_row + warp_tile_m), columns [warp_col, ...) of the tile.
  const int warp_row = warp / Traits::warps_n * Traits::warp_tile_m;
  const int warp_col = warp % Traits::warps_n * Traits::warp_tile_n;
  float accumulator[Traits::mma_tiles_m][Traits::mma_tiles_n][4] = {};

  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    // Tile k_tile has landed (only the stages - 2 newer groups may be pending) for this thread's copies,
    // and the barrier makes every thread's copies visible; it also certifies that all warps are done
    // with the stage consumed in the previous iteration, which the next load overwrites.
    cp_async_wait<Traits::stages - 2>();
    __syncthreads();
    if (k_tile + Traits::stages - 1 < k_tiles) load_stage(k_tile + Traits::stages - 1);
    cp_async_commit();

    const unsigned a_stage = shared_base + (k_tile % Traits::stages) * Traits::stage_bytes;
    unsigned b_stage = a_stage + Traits::a_stage_bytes;
    if constexpr (Traits::quantized) {
      // Every thread's share of the packed stage is visible (barrier above); the bf16 tile was last read
      // by the previous iteration's ldmatrix, which every warp finished before that barrier too.
      dequantize_stage(k_tile);
      __syncthreads();
      b_stage = shared_base + Traits::stages * Traits::stage_bytes;
    }
#pragma unroll
    for (int step = 0; step < Traits::k_steps; ++step) {
      // A fragments: matrices 0..3 = (rows +0..7, k +0..7), (rows +8..15, k +0..7), (rows +0..7, k +8..15),
      // (rows +8..15, k +8..15) of each m16 tile: lane l addresses row l % 16, chunk 2 * step + l / 16.
      unsigned a_fragment[Traits::mma_tiles_m][4];
#pragma unroll
      for (int i = 0; i < Traits::mma_tiles_m; ++i) {
        const int row = warp_row + i * 16 + lane % 16;
        ldmatrix_x4(a_fragment[i], a_stage + swizzled_offset<kChunks>(row, 2 * step + lane / 16));
      }
      // B fragments from W rows (n) with K contiguous, i.e. B = W^T column-major as mma's .col wants:
      // matrices 0..3 = (n +0..7, k +0..7), (n +0..7, k +8..15), (n +8..15, k +0..7), (n +8..15, k +8..15):
      // lane l addresses row (l % 8) + 8 * (l / 16), chunk 2 * step + (l / 8) % 2. Two n8 tiles per load.
      unsigned b_fragment[Traits::mma_tiles_n][2];
#pragma unroll
      for (int j = 0; j < Traits::mma_tiles_n; j += 2) {
        const int row = warp_col + j * 8 + lane % 8 + lane / 16 * 8;
        unsigned loaded[4];
        ldmatrix_x4(loaded, b_stage + swizzled_offset<kChunks>(row, 2 * step + lane / 8 % 2));
        b_fragment[j][0] = loaded[0];
        b_fragment[j][1] = loaded[1];
        b_fragment[j + 1][0] = loaded[2];
        b_fragment[j + 1][1] = loaded[3];
      }
#pragma unroll
      for (int i = 0; i < Traits::mma_tiles_m; ++i) {
#pragma unroll
        for (int j = 0; j < Traits::mma_tiles_n; ++j)
          mma_m16n8k16(accumulator[i][j], a_fragment[i], b_fragment[j]);
      }
    }
  }
  // The pipeline's shared memory becomes the staging tile: no copy may still be writing into it
  // (only empty groups remain, but wait anyway), and every warp must be done reading it.
  cp_async_wait<0>();
  __syncthreads();

  // Accumulator tile (i, j) holds C rows warp_row + 16 i + lane / 4 (+ 8 for elements 2, 3) and columns
  // warp_col + 8 j + 2 (lane % 4) + {0, 1}. Bias in fp32, then the one rounding to bf16.
  __nv_bfloat16* staging = reinterpret_cast<__nv_bfloat16*>(shared);  // [block_m, staging_row_elements]
  const int fragment_row = lane / 4;
  const int fragment_col = lane % 4 * 2;
#pragma unroll
  for (int j = 0; j < Traits::mma_tiles_n; ++j) {
    const int col = warp_col + j * 8 + fragment_col;
    float bias0 = 0.0f, bias1 = 0.0f;
    if constexpr (Traits::has_bias) {
      bias0 = bias_of<Traits::segments>(params, n0 + col);
      bias1 = bias_of<Traits::segments>(params, n0 + col + 1);
    }
#pragma unroll
    for (int i = 0; i < Traits::mma_tiles_m; ++i) {
      const int row = warp_row + i * 16 + fragment_row;
      const float* c = accumulator[i][j];
      *reinterpret_cast<__nv_bfloat162*>(staging + row * Traits::staging_row_elements + col) =
          __floats2bfloat162_rn(c[0] + bias0, c[1] + bias1);
      *reinterpret_cast<__nv_bfloat162*>(staging + (row + 8) * Traits::staging_row_elements + col) =
          __floats2bfloat162_rn(c[2] + bias0, c[3] + bias1);
    }
  }
  __syncthreads();

  // Staging tile -> C, one 16-byte vector (8 columns) per step, consecutive threads along a row.
  // Columns past N (the tail of the last tile column) are stored one by one so that C's padding
  // columns [N, ldc) stay untouched.
  const bf16_bits* staged = reinterpret_cast<const bf16_bits*>(staging);
  constexpr int kVectors = Traits::block_m * Traits::output_vectors_per_row;
  for (int v = threadIdx.x; v < kVectors; v += Traits::threads) {
    const int row = v / Traits::output_vectors_per_row;
    const int col = v % Traits::output_vectors_per_row * 8;
    const int m = m0 + row;
    const int n = n0 + col;
    if (m >= params.m || n >= params.n) continue;
    const int staged_index = row * Traits::staging_row_elements + col;
    const long long c_index = m * params.ldc + n;
    if (n + 8 <= params.n) {
      BF16Vector<8>::load(staged, staged_index).store(params.c, c_index);
    } else {
      for (int e = 0; e < params.n - n; ++e) params.c[c_index + e] = staged[staged_index + e];
    }
  }
}

}  // namespace attnplan::kernels
