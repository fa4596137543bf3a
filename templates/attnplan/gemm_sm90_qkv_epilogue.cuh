// The QKV postprocess in the q|k|v projection's epilogue (gemm_sm90.cuh): per-head RMSNorm of q and k
// (weighted) and of v (no weight), then RoPE of q and k, applied to a consumer warpgroup's tile of fp32
// values in registers before its TMA store. The semantics of qkv_postprocess.cuh (spec sections 3 and 4):
// the projection's bias added in fp32 and the result rounded once to bf16 (what that kernel reads), the
// norm and the rotation in fp32, one rounding at the store. The plan then runs no postprocess pass over the
// q|k|v rows (at 8k tokens of Llama-3.1-8B: 0.057 of the layer's 2.1 ms, docs/kernels-notes.md).
//
// Why a thread has what it needs: it holds, for its two rows (wgmma.cuh's accumulator layout), the columns
// 8 b + 2 (l % 4) + {0, 1} of every 8-column block b of the tile, and the tile holds whole heads (block_n a
// multiple of D, so heads never straddle tiles). So
//   - a norm's sum of squares over a head row is D / 4 of the thread's values plus two shuffles in its quad;
//   - the interleaved pairing (P2 = 2: GPT-J, the MLA rope part) pairs a thread's own column pair;
//   - a half split (rotate_half, partial rotary, pairs across the head) whose half and offset are multiples
//     of 8 pairs block b's columns with the same columns of block b + half / 8, which the thread holds too.
// Other pairings (partners that cross a quad's columns) keep the postprocess kernel: qkv_epilogue_fits on
// the host says which.
//
// The (cos, sin) of each token and pair come from a table the input norm wrote (rmsnorm.cuh): one
// double-precision reduction per token and pair there, rather than one per column tile here.
#pragma once

#include <cuda_bf16.h>

#include "attnplan/gemm_sm90_params.h"
#include "attnplan/params.h"
#include "attnplan/wgmma.cuh"

namespace attnplan::kernels {

// The plain epilogue: C as the product computes it.
struct NoQkvEpilogue {
  static constexpr bool enabled = false;
  static constexpr int blocks = 1;  // QkvTurns' size: a consume_tiles local that nothing then uses
  __device__ static constexpr bool changes(long long) { return false; }
};

// Shapes and flags as QkvPostprocessTraits' (qkv_postprocess.cuh), for a row [q: Hq * D | k: Hkv * D | v:
// Hkv * Dv] of C.
template <int kQueryHeads, int kKvHeads, int kHeadDim, int kValueHeadDim, int kRotaryOffset, int kRotaryDim,
          int kPairingDim, bool kQueryNorm, bool kKeyNorm, bool kValueNorm, bool kUnitOffset>
struct QkvEpilogueTraits {
  static constexpr bool enabled = true;
  static constexpr int query_heads = kQueryHeads;
  static constexpr int kv_heads = kKvHeads;
  static constexpr int head_dim = kHeadDim;
  static constexpr int value_head_dim = kValueHeadDim;
  static constexpr int rotary_offset = kRotaryOffset;  // o
  static constexpr int rotary_dim = kRotaryDim;        // R; 0: no RoPE
  static constexpr int pairing_dim = kPairingDim;      // P2
  static constexpr bool query_norm = kQueryNorm;
  static constexpr bool key_norm = kKeyNorm;
  static constexpr bool value_norm = kValueNorm;
  static constexpr float weight_offset = kUnitOffset ? 1.0f : 0.0f;  // Gemma: q and k scaled by (1 + w)

  static constexpr bool rope = kRotaryDim > 0;
  static constexpr int rotary_pairs = kRotaryDim / 2;
  static constexpr int pair_half = kPairingDim / 2;
  static constexpr bool interleaved = kPairingDim == 2;  // pair i is dims o + 2 i, o + 2 i + 1
  static constexpr int blocks = kHeadDim / 8;            // 8-column blocks of a head
  static constexpr int partner_blocks = pair_half / 8;   // half split: an a block's b block, this far on

  // Column of the first k and v element of a row, and which heads the epilogue changes.
  static constexpr long long key_column = static_cast<long long>(kQueryHeads) * kHeadDim;
  static constexpr long long value_column = key_column + static_cast<long long>(kKvHeads) * kHeadDim;
  static constexpr bool query_work = kQueryNorm || rope;
  static constexpr bool key_work = kKeyNorm || rope;
  static constexpr bool value_work = kValueNorm;

  // Whether column n's head goes through apply_qkv_epilogue (which adds its bias: the store must not).
  __device__ static constexpr bool changes(long long n) {
    return n < key_column ? query_work : n < value_column ? key_work : value_work;
  }

  // Half split: the first of the 8 consecutive pairs whose a's are head block `block`'s 8 dims (spec
  // section 4: pair i = (blk, j) has a = o + P2 blk + j, b = a + half), or -1 when the block holds no
  // rotated pair's a (b's, or dims RoPE passes through). Later pairs of the block may be past R / 2.
  __host__ __device__ static constexpr int first_pair_of_a_block(int block) {
    const int relative = 8 * block - kRotaryOffset;
    if (!rope || interleaved || relative < 0 || relative % kPairingDim >= pair_half) return -1;
    const int pair = relative / kPairingDim * pair_half + relative % kPairingDim;
    return pair < rotary_pairs ? pair : -1;
  }
  // Interleaved: whether head block `block` holds any rotated dim, [o, o + R).
  __host__ __device__ static constexpr bool interleaved_block_rotates(int block) {
    return rope && interleaved && 8 * block < kRotaryOffset + kRotaryDim && 8 * block + 8 > kRotaryOffset;
  }

  static_assert(kQueryHeads > 0 && kKvHeads > 0 && kQueryHeads % kKvHeads == 0,
                "query heads must be a positive multiple of kv heads");
  static_assert(kHeadDim % 8 == 0, "whole 8-column accumulator blocks per head");
  static_assert(kRotaryDim >= 0 && kRotaryDim % 2 == 0 && kRotaryOffset >= 0 &&
                    kRotaryOffset + kRotaryDim <= kHeadDim,
                "an even rotary dim inside the head");
  static_assert(!rope ||
                    (interleaved ? kRotaryOffset % 2 == 0 : pair_half % 8 == 0 && kRotaryOffset % 8 == 0),
                "every pair inside one thread's columns: P2 = 2 at an even offset, or half and offset "
                "multiples of 8 (qkv_epilogue_fits)");
  static_assert(!kValueNorm || kValueHeadDim == kHeadDim, "v heads normalized in the tile: Dv == D");
};

namespace qkv_epilogue_detail {

enum class Role { none, query, key, value };

// A column pair rounded to bf16 and back, by one packed conversion (F2FP) and two integer moves: a
// conversion per value (F2F) and its shift back held 85% of the epilogue's own stall samples on Llama-3.1-8B
// q|k|v (Nsight Compute, docs/kernels-notes.md "Session 25").
__device__ __forceinline__ void bf16_round(float& x0, float& x1) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(x0, x1);
  x0 = __low2float(pair);
  x1 = __high2float(pair);
}

// Sum over the 4 lanes of a quad: the threads holding one row's columns.
__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  value += __shfl_xor_sync(0xffffffffu, value, 2);
  return value;
}

// a' = a cos - b sin, b' = b cos + a sin (qkv_postprocess.cuh's order of operations).
__device__ __forceinline__ void rotate(float& a, float& b, float cosine, float sine) {
  const float a0 = a;
  a = a * cosine - b * sine;
  b = b * cosine + a0 * sine;
}

}  // namespace qkv_epilogue_detail

// The (cos, sin) a thread's two rows need from the rotation table (RmsNormParams): per head block that holds
// pairs' a's, for rows first_row and first_row + 8: a half split's two pairs of the block's column pair as a
// float4 (cos, sin, cos, sin), an interleaved pair as its .x, .y. The same for every q and k head of a tile.
template <class Epilogue>
struct QkvTurns {
  float4 turn[Epilogue::blocks][2];
};

// A consumer warpgroup's 64 table rows from `first_row` on (those below M) into L2, at the start of its tile,
// so that load_qkv_turns at its end finds them there: the table was written before the GEMM began, and the
// GEMM's A and W stream far more than L2 holds in between. One bulk prefetch; call from one thread. (The
// rows may be gone again ~48 us later at 8k tokens; prefetching 2-8 K slices before the tile's end instead
// measured level, and its compare in the K loop spilled Qwen2.5-7B's GEMM: docs/kernels-notes.md,
// "Session 25".)
template <class Epilogue>
__device__ __forceinline__ void prefetch_qkv_table(const GemmQkvEpilogueParams& params, int first_row,
                                                   int m) {
  if constexpr (Epilogue::rope) {
    const int rows = min(64, m - first_row);
    if (rows > 0) {
      sm90::prefetch_l2(params.rotations + static_cast<long long>(first_row) * params.rotation_stride,
                        static_cast<unsigned>(rows * params.rotation_stride * 4));
    }
  }
}

// Every table load of the tile at once, without branches between them: issued before the tile's last wgmmas
// complete, their latency hides behind those and the norms. (Issued next to their use, one L2 round trip per
// head block, they cost the Llama-3.1-8B q|k|v GEMM ~4.6 us a tile: docs/kernels-notes.md, "Session 25".)
// Rows past M and pairs past R / 2 read a valid address (row 0, the last whole pair) and are never used.
template <class Epilogue>
__device__ __forceinline__ QkvTurns<Epilogue> load_qkv_turns(const GemmQkvEpilogueParams& params,
                                                             int first_row, int m) {
  QkvTurns<Epilogue> turns;
  if constexpr (Epilogue::rope) {
    constexpr int kLastEvenPair = (Epilogue::rotary_pairs - 1) / 2 * 2;  // a float4 from it stays in the row
    const int quad_column = 2 * (threadIdx.x % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + 8 * half;
      const float* table =
          params.rotations + static_cast<long long>(row < m ? row : 0) * params.rotation_stride;
#pragma unroll
      for (int block = 0; block < Epilogue::blocks; ++block) {
        if constexpr (Epilogue::interleaved) {
          if (!Epilogue::interleaved_block_rotates(block)) continue;
          const int pair = (8 * block + quad_column - Epilogue::rotary_offset) / 2;
          const int safe = max(0, min(pair, Epilogue::rotary_pairs - 1));
          const float2 turn = __ldg(reinterpret_cast<const float2*>(table + 2 * safe));
          turns.turn[block][half] = make_float4(turn.x, turn.y, 0.0f, 0.0f);
        } else {
          const int first_pair = Epilogue::first_pair_of_a_block(block);
          if (first_pair < 0) continue;
          const int safe = min(first_pair + quad_column, kLastEvenPair);
          turns.turn[block][half] = __ldg(reinterpret_cast<const float4*>(table + 2 * safe));
        }
      }
    }
  }
  return turns;
}

// A consumer warpgroup's [64, kN] tile of C at column n0, in place: accumulator[4 b + 2 h + e] is row
// first_row + 8 h, column n0 + 8 b + 2 (l % 4) + e; `turns` is load_qkv_turns' for those rows. `n` is C's
// width: columns past N are left alone (rows past M are computed on and never stored). `bias(column)`
// returns the bias of the column pair (column, column + 1) as a float2 (zeros without bias). Columns of
// heads the traits do not change keep their values, bias not added: the caller's store adds it. kHasBias:
// whether to add it at all (a GEMM without bias skips the adds of zeros).
template <class Epilogue, int kN, bool kHasBias, class Bias>
__device__ __forceinline__ void apply_qkv_epilogue(float (&accumulator)[kN / 2],
                                                   const QkvTurns<Epilogue>& turns,
                                                   const GemmQkvEpilogueParams& params, int n0, int n,
                                                   Bias&& bias) {
  using namespace qkv_epilogue_detail;
  constexpr int kHeadDim = Epilogue::head_dim;
  constexpr int kBlocks = Epilogue::blocks;
  constexpr int kChunks = kN / kHeadDim;  // heads in the tile
  static_assert(kN % kHeadDim == 0, "the tile must hold whole heads (block_n a multiple of D)");
  const int quad_column = 2 * (threadIdx.x % 4);  // the thread's first column of each 8-column block

  // Each head of the tile: q, k or v, or none where the traits leave it alone (or it lies past N).
  Role role[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const long long column = n0 + c * kHeadDim;
    role[c] = column >= n                       ? Role::none
              : column < Epilogue::key_column   ? (Epilogue::query_work ? Role::query : Role::none)
              : column < Epilogue::value_column ? (Epilogue::key_work ? Role::key : Role::none)
              : Epilogue::value_work            ? Role::value
                                                : Role::none;
  }

  // The bias, one rounding to bf16, then each head's norm: x / rms(x) (* (w + offset) for q and k). Each
  // step's loads (bias, weights) are issued together before their use.
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (role[c] == Role::none) continue;
    float2 terms[kBlocks] = {};
    if constexpr (kHasBias) {
#pragma unroll
      for (int block = 0; block < kBlocks; ++block)
        terms[block] = bias(n0 + 8 * (c * kBlocks + block) + quad_column);
    }
#pragma unroll
    for (int block = 0; block < kBlocks; ++block) {
      const int b = c * kBlocks + block;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float& x0 = accumulator[4 * b + 2 * half];
        float& x1 = accumulator[4 * b + 2 * half + 1];
        if constexpr (kHasBias) {
          x0 += terms[block].x;
          x1 += terms[block].y;
        }
        bf16_round(x0, x1);
      }
    }
    const bool norm = role[c] == Role::query ? Epilogue::query_norm
                      : role[c] == Role::key ? Epilogue::key_norm
                                             : Epilogue::value_norm;
    if (!norm) continue;
    const bool weighted = role[c] != Role::value;  // v's norm has no weight
    float2 w[kBlocks];
    if (weighted) {
      const bf16_bits* weight = role[c] == Role::query ? params.q_norm_weight : params.k_norm_weight;
#pragma unroll
      for (int block = 0; block < kBlocks; ++block) {
        const __nv_bfloat162 pair =
            *reinterpret_cast<const __nv_bfloat162*>(weight + 8 * block + quad_column);
        w[block] = make_float2(__low2float(pair) + Epilogue::weight_offset,
                               __high2float(pair) + Epilogue::weight_offset);
      }
    }
    float inverse_rms[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum_of_squares = 0.0f;
#pragma unroll
      for (int block = 0; block < kBlocks; ++block) {
        const float* x = &accumulator[4 * (c * kBlocks + block) + 2 * half];
        sum_of_squares += x[0] * x[0] + x[1] * x[1];
      }
      inverse_rms[half] = rsqrtf(quad_sum(sum_of_squares) / kHeadDim + params.epsilon);
    }
#pragma unroll
    for (int block = 0; block < kBlocks; ++block) {
      const int b = c * kBlocks + block;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float& x0 = accumulator[4 * b + 2 * half];
        float& x1 = accumulator[4 * b + 2 * half + 1];
        x0 *= inverse_rms[half];
        x1 *= inverse_rms[half];
        if (weighted) {
          x0 *= w[block].x;
          x1 *= w[block].y;
        }
      }
    }
  }

  if constexpr (Epilogue::rope) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (role[c] != Role::query && role[c] != Role::key) continue;
#pragma unroll
      for (int block = 0; block < kBlocks; ++block) {
        if constexpr (Epilogue::interleaved) {
          if (!Epilogue::interleaved_block_rotates(block)) continue;
          const int dim = 8 * block + quad_column;  // the pair's a; its b is dim + 1
          const int pair = (dim - Epilogue::rotary_offset) / 2;
          if (dim < Epilogue::rotary_offset || pair >= Epilogue::rotary_pairs) continue;
          const int b = c * kBlocks + block;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float4 turn = turns.turn[block][half];
            rotate(accumulator[4 * b + 2 * half], accumulator[4 * b + 2 * half + 1], turn.x, turn.y);
          }
        } else {
          const int first_pair = Epilogue::first_pair_of_a_block(block);
          if (first_pair < 0) continue;
          const int pair = first_pair + quad_column;  // the thread's pairs: pair (e = 0) and pair + 1 (e = 1)
          // Pairs past R / 2 in the block's last rotated 8 (R / 2 not a multiple of 8) pass through.
          const bool whole = first_pair + 8 <= Epilogue::rotary_pairs;
          const bool first = whole || pair < Epilogue::rotary_pairs;
          const bool second = whole || pair + 1 < Epilogue::rotary_pairs;
          const int a = c * kBlocks + block;
          const int b = a + Epilogue::partner_blocks;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float4 turn = turns.turn[block][half];
            if (first) rotate(accumulator[4 * a + 2 * half], accumulator[4 * b + 2 * half], turn.x, turn.y);
            if (second) {
              rotate(accumulator[4 * a + 2 * half + 1], accumulator[4 * b + 2 * half + 1], turn.z, turn.w);
            }
          }
        }
      }
    }
  }
}

}  // namespace attnplan::kernels
