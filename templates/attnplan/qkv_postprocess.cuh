// QKV postprocess, in place on the fused QKV projection output: per-head RMSNorm (spec section 3), then
// RoPE (spec section 4), one bf16 rounding at the end.
//
// One block per token. Its threads first turn the token's position into a table of (cos, sin) per
// rotary pair, which every q and k head of the token shares; then each warp takes whole head rows. A
// row stays in fp32 registers from its load to its store (normalized, then rotated). The partner of a
// rotated dimension (b = a + P2 / 2) may sit anywhere in the head, so unless every pair lies inside
// one lane's vector (P2 = 2), the row is staged in the warp's shared-memory buffer first and each
// lane reads its partners from there (see PairExchange).
#pragma once

#include "attnplan/common.cuh"
#include "attnplan/qkv_postprocess_params.h"
#include "attnplan/rope.cuh"

namespace attnplan::kernels {

// How one warp holds a head row of kDim bf16: lane l owns vectors l, l + 32, ... of kVector elements.
template <int kDim, int kVector>
struct WarpRowLayout {
  static constexpr int dim = kDim;
  static constexpr int vector = kVector;
  static constexpr int vectors = kDim / kVector;
  static constexpr int vectors_per_lane = (vectors + 31) / 32;
  static constexpr int elements_per_lane = vectors_per_lane * kVector;

  static_assert(kVector == 1 || kVector == 2 || kVector == 4 || kVector == 8, "vector must be 1, 2, 4 or 8");
  static_assert(kDim > 0 && kDim % kVector == 0, "the vector width must divide the head dim");
  static_assert(elements_per_lane <= 32, "a head row must fit in registers: head dims up to 1024");
};

enum class PairExchange { none, in_vector, whole_vectors, elements };

// kVector fp32 values moved as one aligned shared-memory access (split into 16-byte ones above 4).
template <int N>
struct alignas(4 * N) FloatVector {
  float values[N];
};
// kVector consecutive (cos, sin) pairs of the rotation table.
template <int N>
struct alignas(8 * N) RotationVector {
  float2 values[N];
};

template <int kQueryHeads, int kKvHeads, int kHeadDim, int kValueHeadDim, int kRotaryOffset, int kRotaryDim,
          int kPairingDim, bool kQueryNorm, bool kKeyNorm, bool kValueNorm, bool kUnitOffset, int kThreads,
          int kHeadVector, int kValueVector>
struct QkvPostprocessTraits {
  using Params = QkvPostprocessParams;
  static constexpr int query_heads = kQueryHeads;
  static constexpr int kv_heads = kKvHeads;
  static constexpr int head_dim = kHeadDim;             // D: q and k heads
  static constexpr int value_head_dim = kValueHeadDim;  // Dv
  static constexpr int rotary_offset = kRotaryOffset;   // o: first dimension RoPE may touch
  static constexpr int rotary_dim = kRotaryDim;         // R: rotated dimensions; 0 = no RoPE
  static constexpr int pairing_dim = kPairingDim;       // P2: partners sit P2 / 2 apart in a block of P2
  static constexpr bool query_norm = kQueryNorm;
  static constexpr bool key_norm = kKeyNorm;
  static constexpr bool value_norm = kValueNorm;    // no weight
  static constexpr bool unit_offset = kUnitOffset;  // Gemma: q and k scaled by (1 + w)
  static constexpr int threads = kThreads;
  static constexpr int warps = kThreads / 32;

  using HeadLayout = WarpRowLayout<kHeadDim, kHeadVector>;
  using ValueLayout = WarpRowLayout<kValueHeadDim, kValueVector>;

  static constexpr bool rope = kRotaryDim > 0;
  static constexpr int rotary_pairs = kRotaryDim / 2;
  static constexpr int pair_half = kPairingDim / 2;

  // Head rows touched per token, in task order: q heads, then k heads, then v heads. A q or k head is
  // skipped when neither its norm nor RoPE changes it, v heads unless v is normalized.
  static constexpr int query_tasks = (kQueryNorm || rope) ? kQueryHeads : 0;
  static constexpr int key_tasks = (kKeyNorm || rope) ? kKvHeads : 0;
  static constexpr int value_tasks = kValueNorm ? kKvHeads : 0;
  static constexpr int tasks = query_tasks + key_tasks + value_tasks;

  // Column of the first k and v element in a token row; the row is [q: Hq * D | k: Hkv * D | v: Hkv * Dv].
  static constexpr long long key_column = static_cast<long long>(kQueryHeads) * kHeadDim;
  static constexpr long long value_column = key_column + static_cast<long long>(kKvHeads) * kHeadDim;
  static constexpr long long row_width = value_column + static_cast<long long>(kKvHeads) * kValueHeadDim;
  // The row stride and the qkv pointer must be multiples of this many elements (vector accesses).
  static constexpr int row_alignment = kHeadVector > kValueVector ? kHeadVector : kValueVector;

  // The pair that dimension `dim` of a q or k head belongs to, or -1 if RoPE passes it through. Pair i
  // holds a = o + P2 * (i / half) + i % half and b = a + half (spec section 4), so inverting: the block
  // of P2 that `dim` falls in, and its place in that block modulo half.
  __host__ __device__ static constexpr int pair_of(int dim) {
    const int relative = dim - kRotaryOffset;
    if (!rope || relative < 0) return -1;
    const int pair = relative / kPairingDim * pair_half + relative % kPairingDim % pair_half;
    return pair < rotary_pairs ? pair : -1;
  }
  // For a rotated `dim`: whether it is its pair's a (partner at dim + half) rather than its b.
  __host__ __device__ static constexpr bool is_first_of_pair(int dim) {
    return (dim - kRotaryOffset) % kPairingDim < pair_half;
  }
  // b of the last pair: the highest dimension RoPE touches (pairs' a and b grow with i).
  static constexpr int last_rotated_dim = rope ? kRotaryOffset +
                                                     kPairingDim * ((rotary_pairs - 1) / pair_half) +
                                                     (rotary_pairs - 1) % pair_half + pair_half
                                               : -1;

  // How a lane reaches the partner of a rotated dimension it owns, cheapest first:
  //   in_vector:     every pair lies inside one vector (P2 divides the vector and o), so the partner is in
  //                  the lane's own registers (GPT-J's interleaved pairs);
  //   whole_vectors: a vector's dims are all a's or all b's of consecutive pairs (o, half and R/2 are
  //                  multiples of the vector), so the partner vector is one aligned shared-memory read
  //                  and the vector's (cos, sin) another (rotate_half, partial rotary);
  //   elements:      anything else valid, one element at a time through shared memory.
  static constexpr PairExchange pair_exchange =
      !rope ? PairExchange::none
      : (kPairingDim <= kHeadVector && kHeadVector % kPairingDim == 0 && kRotaryOffset % kPairingDim == 0)
          ? PairExchange::in_vector
      : (kRotaryOffset % kHeadVector == 0 && pair_half % kHeadVector == 0 && rotary_pairs % kHeadVector == 0)
          ? PairExchange::whole_vectors
          : PairExchange::elements;
  static constexpr bool stages_rows =
      pair_exchange == PairExchange::whole_vectors || pair_exchange == PairExchange::elements;

  static_assert(kQueryHeads > 0 && kKvHeads > 0 && kQueryHeads % kKvHeads == 0,
                "query heads must be a positive multiple of kv heads");
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "threads must be 1 to 32 warps");
  static_assert(kRotaryDim >= 0 && kRotaryDim % 2 == 0, "the rotary dim must be even (0: no RoPE)");
  static_assert(kRotaryOffset >= 0 && kRotaryOffset + kRotaryDim <= kHeadDim, "o + R must fit in the head");
  static_assert(kPairingDim >= 2 && kPairingDim % 2 == 0,
                "the pairing dim must be even and >= 2 (any such value when R = 0; the spec passes 2)");
  static_assert(!rope || kPairingDim > kRotaryDim || kRotaryDim % kPairingDim == 0,
                "a pairing dim <= R must divide R");
  static_assert(last_rotated_dim < kHeadDim, "every pair's partner must lie inside the head");
  static_assert(value_column % kValueVector == 0, "v heads must start on a vector boundary");
};

namespace qkv_postprocess {

// Whether any element of the vector starting at `first` is rotated.
template <class Traits, int kVector>
__device__ __forceinline__ bool vector_is_rotated(int first) {
  bool rotated = false;
#pragma unroll
  for (int e = 0; e < kVector; ++e) rotated |= Traits::pair_of(first + e) >= 0;
  return rotated;
}

// The lane's part of a [D] norm weight, as (w + weight_offset) in fp32, in the lane's head layout.
template <class Layout, bool kUnitOffset>
__device__ __forceinline__ void load_norm_weight(const bf16_bits* weight,
                                                 float (&lane_weight)[Layout::elements_per_lane], int lane) {
  using Vector = BF16Vector<Layout::vector>;
#pragma unroll
  for (int m = 0; m < Layout::vectors_per_lane; ++m) {
    const int v = lane + 32 * m;
    Vector w{};
    if (v < Layout::vectors) w = Vector::load(weight, v * Layout::vector);
#pragma unroll
    for (int e = 0; e < Layout::vector; ++e) {
      lane_weight[m * Layout::vector + e] = __bfloat162float(w.values[e]) + (kUnitOffset ? 1.0f : 0.0f);
    }
  }
}

// One head row of Layout::dim bf16 at `head`, processed in place by one warp.
//   kNorm:  RMSNorm over the row, times `lane_weight` (already w + offset) when kWeighted.
//   kRope:  rotates the pairs with the block's `rotation` table [rotary_pairs]; `staging` is the warp's
//           [D] fp32 buffer through which lanes read their partners.
// Vectors that neither step changes are not even loaded; in a vector that is stored, elements RoPE passes
// through (without a norm) keep their original bits.
template <class Traits, class Layout, bool kNorm, bool kWeighted, bool kRope>
__device__ __forceinline__ void process_head(bf16_bits* head,
                                             const float (&lane_weight)[Layout::elements_per_lane],
                                             const float2* rotation, float* staging, float epsilon,
                                             int lane) {
  static_assert(kNorm || kRope, "a head with neither a norm nor RoPE is not a task");
  using Vector = BF16Vector<Layout::vector>;
  constexpr int kVector = Layout::vector;

  Vector raw[Layout::vectors_per_lane];
  float x[Layout::vectors_per_lane][kVector];
  bool live[Layout::vectors_per_lane];
#pragma unroll
  for (int m = 0; m < Layout::vectors_per_lane; ++m) {
    const int first = (lane + 32 * m) * kVector;
    live[m] = first < Layout::dim && (kNorm || vector_is_rotated<Traits, kVector>(first));
    raw[m] = live[m] ? Vector::load(head, first) : Vector{};
#pragma unroll
    for (int e = 0; e < kVector; ++e) x[m][e] = __bfloat162float(raw[m].values[e]);
  }

  if constexpr (kNorm) {
    // Dead vectors hold zeros, so they add nothing.
    float sum_of_squares = 0.0f;
#pragma unroll
    for (int m = 0; m < Layout::vectors_per_lane; ++m) {
#pragma unroll
      for (int e = 0; e < kVector; ++e) sum_of_squares += x[m][e] * x[m][e];
    }
    const float inverse_rms = rsqrtf(warp_sum(sum_of_squares) / Layout::dim + epsilon);
#pragma unroll
    for (int m = 0; m < Layout::vectors_per_lane; ++m) {
#pragma unroll
      for (int e = 0; e < kVector; ++e) {
        x[m][e] *= inverse_rms;
        if constexpr (kWeighted) x[m][e] *= lane_weight[m * kVector + e];
      }
    }
  }

  if constexpr (kRope && Traits::pair_exchange == PairExchange::in_vector) {
    // first and o are multiples of P2, so element e of a vector is an a exactly when e % P2 < half, and
    // its b is element e + half of the same vector.
#pragma unroll
    for (int m = 0; m < Layout::vectors_per_lane; ++m) {
      const int first = (lane + 32 * m) * kVector;
      if (!live[m]) continue;
#pragma unroll
      for (int e = 0; e < kVector; ++e) {
        if (e % Traits::pairing_dim >= Traits::pair_half) continue;
        const int pair = Traits::pair_of(first + e);
        if (pair < 0) continue;
        const float2 turn = rotation[pair];  // (cos, sin)
        const float a = x[m][e], b = x[m][e + Traits::pair_half];
        x[m][e] = a * turn.x - b * turn.y;
        x[m][e + Traits::pair_half] = b * turn.x + a * turn.y;
      }
    }
  } else if constexpr (kRope) {
    // Every element a partner may be read from is staged: a rotated element's partner is rotated too,
    // so it sits in a live vector.
#pragma unroll
    for (int m = 0; m < Layout::vectors_per_lane; ++m) {
      const int first = (lane + 32 * m) * kVector;
      if (!live[m]) continue;
      FloatVector<kVector> staged;
#pragma unroll
      for (int e = 0; e < kVector; ++e) staged.values[e] = x[m][e];
      *reinterpret_cast<FloatVector<kVector>*>(staging + first) = staged;
    }
    __syncwarp();
#pragma unroll
    for (int m = 0; m < Layout::vectors_per_lane; ++m) {
      const int first = (lane + 32 * m) * kVector;
      if (!live[m]) continue;
      if constexpr (Traits::pair_exchange == PairExchange::whole_vectors) {
        const int pair = Traits::pair_of(first);  // of the vector's first element; the rest follow it
        if (pair < 0) continue;
        const bool is_a = Traits::is_first_of_pair(first);
        const int partner_first = is_a ? first + Traits::pair_half : first - Traits::pair_half;
        const FloatVector<kVector> partner =
            *reinterpret_cast<const FloatVector<kVector>*>(staging + partner_first);
        const RotationVector<kVector> turns =
            *reinterpret_cast<const RotationVector<kVector>*>(rotation + pair);
#pragma unroll
        for (int e = 0; e < kVector; ++e) {
          const float own = x[m][e] * turns.values[e].x, other = partner.values[e] * turns.values[e].y;
          x[m][e] = is_a ? own - other : own + other;  // a' = a cos - b sin, b' = b cos + a sin
        }
      } else {
#pragma unroll
        for (int e = 0; e < kVector; ++e) {
          const int dim = first + e;
          const int pair = Traits::pair_of(dim);
          if (pair < 0) continue;
          const float2 turn = rotation[pair];  // (cos, sin)
          if (Traits::is_first_of_pair(dim)) {
            x[m][e] = x[m][e] * turn.x - staging[dim + Traits::pair_half] * turn.y;  // a' = a cos - b sin
          } else {
            x[m][e] = x[m][e] * turn.x + staging[dim - Traits::pair_half] * turn.y;  // b' = b cos + a sin
          }
        }
      }
    }
    // The next head this warp takes overwrites the buffer.
    __syncwarp();
  }

#pragma unroll
  for (int m = 0; m < Layout::vectors_per_lane; ++m) {
    const int first = (lane + 32 * m) * kVector;
    if (!live[m]) continue;
    Vector out;
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      const bool changed = kNorm || Traits::pair_of(first + e) >= 0;
      out.values[e] = changed ? __float2bfloat16(x[m][e]) : raw[m].values[e];
    }
    out.store(head, first);
  }
}

}  // namespace qkv_postprocess

// grid: [num_tokens], block: [Traits::threads]
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) qkv_postprocess_kernel(const QkvPostprocessParams params) {
  using HeadLayout = typename Traits::HeadLayout;
  using ValueLayout = typename Traits::ValueLayout;
  const int token = blockIdx.x;
  if (token >= params.num_tokens) return;  // the whole block leaves together, before any barrier
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  // Norm weights first: their loads overlap the position lookup below.
  float query_weight[HeadLayout::elements_per_lane] = {};
  float key_weight[HeadLayout::elements_per_lane] = {};
  if constexpr (Traits::query_norm) {
    qkv_postprocess::load_norm_weight<HeadLayout, Traits::unit_offset>(params.q_norm_weight, query_weight,
                                                                       lane);
  }
  if constexpr (Traits::key_norm) {
    qkv_postprocess::load_norm_weight<HeadLayout, Traits::unit_offset>(params.k_norm_weight, key_weight,
                                                                       lane);
  }
  const float no_weight[ValueLayout::elements_per_lane] = {};

  // [R / 2] (cos, sin) and [warps, D]; aligned for the widest FloatVector / RotationVector access.
  __shared__ alignas(64) float2 rotation[Traits::rope ? Traits::rotary_pairs : 1];
  __shared__ alignas(32) float staging[Traits::warps][Traits::stages_rows ? Traits::head_dim : 1];
  if constexpr (Traits::rope) {
    const int seq = sequence_of_token(params.query_starts, params.num_seqs, token);
    const long long position =
        static_cast<long long>(params.context_lens[seq]) + token - params.query_starts[seq];
    for (int pair = threadIdx.x; pair < Traits::rotary_pairs; pair += Traits::threads) {
      rotation[pair] = rotation_at(position, params.frequencies[pair], params.attention_factor);
    }
    __syncthreads();
  }

  bf16_bits* row = params.qkv + token * params.qkv_row_stride;  // [Hq * D | Hkv * D | Hkv * Dv]
  for (int task = warp; task < Traits::tasks; task += Traits::warps) {
    if (task < Traits::query_tasks) {
      if constexpr (Traits::query_tasks > 0) {
        qkv_postprocess::process_head<Traits, HeadLayout, Traits::query_norm, true, Traits::rope>(
            row + static_cast<long long>(task) * Traits::head_dim, query_weight, rotation, staging[warp],
            params.epsilon, lane);
      }
    } else if (task < Traits::query_tasks + Traits::key_tasks) {
      if constexpr (Traits::key_tasks > 0) {
        const int head = task - Traits::query_tasks;
        qkv_postprocess::process_head<Traits, HeadLayout, Traits::key_norm, true, Traits::rope>(
            row + Traits::key_column + static_cast<long long>(head) * Traits::head_dim, key_weight, rotation,
            staging[warp], params.epsilon, lane);
      }
    } else {
      if constexpr (Traits::value_tasks > 0) {
        const int head = task - Traits::query_tasks - Traits::key_tasks;
        qkv_postprocess::process_head<Traits, ValueLayout, true, false, false>(
            row + Traits::value_column + static_cast<long long>(head) * Traits::value_head_dim, no_weight,
            rotation, staging[warp], params.epsilon, lane);
      }
    }
  }
}

}  // namespace attnplan::kernels
