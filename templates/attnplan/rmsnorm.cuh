// Input RMSNorm over one [num_tokens, hidden_size] bf16 activation: one block per token row, the row
// held in registers between the sum-of-squares pass and the scaling pass, 16-byte accesses.
//
// With kFp8Codes (a plan whose q|k|v projection takes fp8 activations) the kernel also rounds the
// normalized row to the projection's e4m3 codes and scales itself (fp8_activation.cuh: the quantizer's
// rule, of the same bf16 values), so the plan runs no separate quantizer over it: the quantizer's read
// of the bf16 row and, when the bf16 row is not wanted (output null), its write are saved. The scales are
// per 128 channels (a half-warp's amax), or with kFp8TokenScales one per token (the block's amax, over
// the normalized row kept in registers until it is known).
//
// With kRotaryPairs (a plan whose q|k|v GEMM applies RoPE in its epilogue, gemm_sm90_qkv_epilogue.cuh)
// the block also writes its token's row of the rotation table: each pair's (cos, sin), which every q and k
// head of the token shares. Computed once per token here (rope.cuh's double-precision reduction and
// sincospif), a GEMM tile would otherwise form the same angle once per column tile: 20 times a token for
// Llama-3.1-8B's q and k heads (docs/kernels-notes.md).
#pragma once

#include "attnplan/common.cuh"
#include "attnplan/fp8_activation.cuh"
#include "attnplan/rope.cuh"

namespace attnplan::kernels {

template <int kHiddenSize, int kThreads, bool kUnitOffset, bool kFp8Codes = false, int kRotaryPairs = 0,
          bool kFp8TokenScales = false>
struct RmsNormTraits {
  using Params = RmsNormParams;
  static constexpr int hidden_size = kHiddenSize;
  static constexpr int threads = kThreads;
  static constexpr bool unit_offset = kUnitOffset;           // Gemma: scale by (1 + w)
  static constexpr bool fp8_codes = kFp8Codes;               // also the e4m3 codes + scales (params.codes)
  static constexpr bool fp8_token_scales = kFp8TokenScales;  // one scale per token, not per 128 channels
  static constexpr int rotary_pairs = kRotaryPairs;  // also the token's rotation table row (params.rotations)
  static constexpr int vector = vector_width_for(kHiddenSize);
  static constexpr int vectors_per_row = kHiddenSize / vector;
  static constexpr int vectors_per_thread = (vectors_per_row + kThreads - 1) / kThreads;

  static_assert(kHiddenSize > 0, "hidden_size must be positive");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "threads must be whole warps, at most 1024");
  static_assert(vectors_per_thread <= 16, "a row must fit in registers: raise threads");
  static_assert(kRotaryPairs >= 0, "rotary pairs: 0 (no table) or R / 2");
  // Vector v of the row is held by thread v % threads, so with 8-channel vectors and whole half-warps an
  // activation group (16 consecutive vectors) is one half-warp's.
  static_assert(!kFp8Codes || (vector == kFp8ChannelsPerLane && kThreads % kFp8GroupLanes == 0),
                "fp8 codes need 8-channel vectors (hidden_size a multiple of 8)");
  static_assert(kFp8Codes || !kFp8TokenScales, "token scales are a choice of the fp8 codes");
};

// grid: [num_tokens], block: [Traits::threads]
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) rmsnorm_kernel(const RmsNormParams params) {
  using Vector = BF16Vector<Traits::vector>;
  const int token = blockIdx.x;
  if (token >= params.num_tokens) return;
  const long long row = static_cast<long long>(token) * Traits::hidden_size;

  Vector cached[Traits::vectors_per_thread];
  float sum_of_squares = 0.0f;
#pragma unroll
  for (int i = 0; i < Traits::vectors_per_thread; ++i) {
    const int v = threadIdx.x + i * Traits::threads;
    if (v < Traits::vectors_per_row) {
      cached[i] = Vector::load(params.input, row + v * Traits::vector);
#pragma unroll
      for (int e = 0; e < Traits::vector; ++e) {
        const float x = __bfloat162float(cached[i].values[e]);
        sum_of_squares += x * x;
      }
    }
  }
  if constexpr (Traits::rotary_pairs > 0) {
    // While the row's loads are in flight: the position lookup and the rotations.
    if (params.rotations != nullptr) {
      const int seq = sequence_of_token(params.query_starts, params.num_seqs, token);
      const long long position =
          static_cast<long long>(params.context_lens[seq]) + token - params.query_starts[seq];
      float2* table = reinterpret_cast<float2*>(params.rotations +
                                                static_cast<long long>(token) * params.rotation_stride);
      for (int pair = threadIdx.x; pair < Traits::rotary_pairs; pair += Traits::threads)
        table[pair] = rotation_at(position, params.frequencies[pair], params.attention_factor);
    }
  }
  const float total = block_sum<Traits::threads>(sum_of_squares);
  const float inverse_rms = rsqrtf(total / Traits::hidden_size + params.epsilon);

  // Per-token fp8 codes: the normalized row, kept until the block knows its amax.
  constexpr bool token_codes = Traits::fp8_codes && Traits::fp8_token_scales;
  Vector normalized[token_codes ? Traits::vectors_per_thread : 1];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < Traits::vectors_per_thread; ++i) {
    const int v = threadIdx.x + i * Traits::threads;
    const bool inside = v < Traits::vectors_per_row;
    Vector out;
    if (inside) {
      const Vector weight = Vector::load(params.weight, v * Traits::vector);
#pragma unroll
      for (int e = 0; e < Traits::vector; ++e) {
        float w = __bfloat162float(weight.values[e]);
        if constexpr (Traits::unit_offset) w += 1.0f;
        out.values[e] = __float2bfloat16(__bfloat162float(cached[i].values[e]) * inverse_rms * w);
      }
      if (!Traits::fp8_codes || params.output != nullptr) out.store(params.output, row + v * Traits::vector);
    }
    if constexpr (token_codes) {
      normalized[i] = out;
      if (inside) {
#pragma unroll
        for (int e = 0; e < kFp8ChannelsPerLane; ++e)
          amax = fmaxf(amax, fabsf(__bfloat162float(out.values[e])));
      }
    } else if constexpr (Traits::fp8_codes) {
      // Every lane of the half-warp joins the amax (the row's last group may be short: lanes past it
      // count 0); params.codes is the same for the whole block.
      if (params.codes != nullptr) {
        float values[kFp8ChannelsPerLane] = {};
        if (inside) {
#pragma unroll
          for (int e = 0; e < kFp8ChannelsPerLane; ++e) values[e] = __bfloat162float(out.values[e]);
        }
        const float scale = fp8_activation_scale(values);
        if (inside) {
          *reinterpret_cast<uint2*>(params.codes + token * params.ld_codes + v * kFp8ChannelsPerLane) =
              fp8_activation_codes(values, scale);
          if (v % kFp8GroupLanes == 0) params.scales[v / kFp8GroupLanes * params.scale_ld + token] = scale;
        }
      }
    }
  }
  if constexpr (token_codes) {
    // params.codes is the same for the whole block, so every thread joins block_max or none does.
    if (params.codes != nullptr) {
      const float scale = fp8_scale_of(block_max<Traits::threads>(amax));
#pragma unroll
      for (int i = 0; i < Traits::vectors_per_thread; ++i) {
        const int v = threadIdx.x + i * Traits::threads;
        if (v < Traits::vectors_per_row) {
          float values[kFp8ChannelsPerLane];
#pragma unroll
          for (int e = 0; e < kFp8ChannelsPerLane; ++e) values[e] = __bfloat162float(normalized[i].values[e]);
          *reinterpret_cast<uint2*>(params.codes + token * params.ld_codes + v * kFp8ChannelsPerLane) =
              fp8_activation_codes(values, scale);
        }
      }
      if (threadIdx.x == 0) params.scales[token] = scale;  // group 0: the token's one scale
    }
  }
}

}  // namespace attnplan::kernels
