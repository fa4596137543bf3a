// The fp8-activation projection for sm_90a: activations quantized to e4m3 per token (tensor and channel
// weight scales: fp8_quantize_tokens_kernel) or per (token, 128 channels) (block weight scales:
// fp8_quantize_kernel), both for every arch, then C[M, N] = A·W^T on the fp8 tensor cores by
// gemm_sm90_fp8_kernel (wgmma m64n128k32 e4m3 x e4m3 -> fp32). The rounding rule is in
// gemm_sm90_fp8_params.h.
//
// The GEMM has gemm_sm90.cuh's structure (persistent CTAs of one TMA producer warpgroup and two consumer
// warpgroups, a ring of 128-byte-swizzled slots with full/empty mbarriers, grouped rasterization), with
// one change in the consumers (DeepSeek-V3's promotion): a ring slot holds one 128-wide K block, which is
// one activation scale group and one 128x128 weight scale block. The 4 wgmma k32 of the slot go into a
// fresh fp32 `partial`; once they complete, partial * a_scale(row, block) * w_scale(block) is added to
// the fp32 `accumulator`. So every scale is applied exactly, in fp32, and the tensor cores' limited fp8
// accumulation precision covers only 128 products. Tensor and channel weight scales are constant along K,
// and so are the activation scales that go with them (one per token): the promotion is then a plain add
// and every scale is applied once, in the epilogue. Each consumer keeps two partials, so its next block's
// wgmmas run while it promotes the last one.
//
// Tails: TMA zero-fills rows past M or a segment's end and K past K (codes 0), so any M, any N, any K that
// is a multiple of 16 (16-byte rows of codes) work.
#pragma once

#include "attnplan/common.cuh"
#include "attnplan/fp8_activation.cuh"
#include "attnplan/gemm.cuh"
#include "attnplan/gemm_fp8_epilogue.cuh"
#include "attnplan/gemm_sm90_epilogue.cuh"
#include "attnplan/gemm_sm90_fp8_params.h"
#include "attnplan/gemm_sm90_qkv_epilogue.cuh"
#include "attnplan/gemm_sm90_ring.cuh"
#include "attnplan/wgmma.cuh"

namespace attnplan::kernels {

// ---------------------------------------------------------------------------------------------------
// Quantizer: one half-warp per (token, group of 128 channels), 8 channels per lane, so each lane has one
// 16-byte load in flight (a warp per group with 8-byte loads ran at ~1.7 TB/s).

template <int kGroup, int kWarps>
struct Fp8QuantizeTraits {
  using Params = Fp8QuantizeParams;
  static constexpr int warps = kWarps;
  static constexpr int threads = 32 * warps;
  static constexpr int group = kGroup;
  // A half-warp per item (16 lanes), as the host's launch shape counts; 8 consecutive channels per lane.
  static constexpr int lanes_per_group = 32 / kFp8QuantizeGroupsPerWarp;
  static constexpr int groups_per_block = threads / lanes_per_group;  // (token, group) items per CTA
  static constexpr int per_lane = group / lanes_per_group;
  static_assert(per_lane == kFp8ChannelsPerLane && lanes_per_group == kFp8GroupLanes,
                "the loads and stores below move 8 channels per lane, 16 lanes per group");
  static_assert(group == kFp8ActivationGroup && kFp8GroupLanes * kFp8ChannelsPerLane == kFp8ActivationGroup,
                "the GEMM reads one scale per 128 channels");
};

// A lane's 8 channels from `at` (16-byte aligned): one 16-byte load, widened to fp32.
__device__ __forceinline__ void load_fp8_channels(const bf16_bits* at, float (&values)[kFp8ChannelsPerLane]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(at);
  const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&words[i]);
    values[2 * i] = __low2float(pair);
    values[2 * i + 1] = __high2float(pair);
  }
}

// grid: [ceil(M * ceil(K / 128) / groups_per_block)], block: [Traits::threads]. K a multiple of 16, lda a
// multiple of 8 and A 16-byte aligned (check_gemm_operands), so a lane's 8 channels are one aligned load.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) fp8_quantize_kernel(const Fp8QuantizeParams params) {
  const int groups = (params.k + Traits::group - 1) / Traits::group;
  const long long items = static_cast<long long>(params.m) * groups;
  const long long item =
      static_cast<long long>(blockIdx.x) * Traits::groups_per_block + threadIdx.x / Traits::lanes_per_group;
  // No early return for a half-warp past the end: its other half still needs it in the shuffles.
  const bool valid = item < items;
  const int lane = threadIdx.x % Traits::lanes_per_group;
  const int m = valid ? static_cast<int>(item / groups) : 0;
  const int group = valid ? static_cast<int>(item % groups) : 0;
  const int k0 = group * Traits::group + Traits::per_lane * lane;
  // K % 16 == 0: a lane's 8 channels are all inside K or all past it.
  const bool inside = valid && k0 < params.k;
  float values[Traits::per_lane] = {};
  if (inside) load_fp8_channels(params.input + m * params.ld_input + k0, values);
  const float scale = fp8_activation_scale(values);
  if (inside) {
    *reinterpret_cast<uint2*>(params.codes + m * params.ld_codes + k0) = fp8_activation_codes(values, scale);
  }
  if (valid && lane == 0) params.scales[group * params.scale_ld + m] = scale;
}

// The per-token quantizer (tensor and channel weight scales): one CTA per token. A first pass takes the
// row's amax, a second converts it (its loads hit L1: a row is at most a few tens of KiB), 8 channels
// per thread and pass step, one 16-byte load each.
template <int kThreads>
struct Fp8TokenQuantizeTraits {
  using Params = Fp8QuantizeParams;
  static constexpr int threads = kThreads;
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
};

// grid: [M], block: [Traits::threads]. K a multiple of 16, lda a multiple of 8 and A 16-byte aligned
// (check_gemm_operands), so 8 channels are one aligned load.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads)
    fp8_quantize_tokens_kernel(const Fp8QuantizeParams params) {
  const int m = blockIdx.x;
  if (m >= params.m) return;  // the whole block: no thread is left out of block_max
  const bf16_bits* input = params.input + m * params.ld_input;
  float amax = 0.0f;
  for (int k0 = kFp8ChannelsPerLane * threadIdx.x; k0 < params.k;
       k0 += kFp8ChannelsPerLane * Traits::threads) {
    float values[kFp8ChannelsPerLane];
    load_fp8_channels(input + k0, values);
    amax = fmaxf(amax, fp8_lane_amax(values));
  }
  const float scale = fp8_scale_of(block_max<Traits::threads>(amax));
  for (int k0 = kFp8ChannelsPerLane * threadIdx.x; k0 < params.k;
       k0 += kFp8ChannelsPerLane * Traits::threads) {
    float values[kFp8ChannelsPerLane];
    load_fp8_channels(input + k0, values);
    *reinterpret_cast<uint2*>(params.codes + m * params.ld_codes + k0) = fp8_activation_codes(values, scale);
  }
  if (threadIdx.x == 0) params.scales[m] = scale;  // group 0: the token's one scale
}

// ---------------------------------------------------------------------------------------------------
// The GEMM.

// kGranularity: the weight scales, as gemm.cuh's Fp8Weights: 0 one f32 per tensor, 1 one f32 per row of W,
// 2 one f32 per 128x128 block ([ceil(rows / 128), ceil(K / 128)] per segment).
// kQkvEpilogue: NoQkvEpilogue, or QkvEpilogueTraits<...> for a q|k|v projection whose epilogue applies the
// QKV postprocess (gemm_sm90_qkv_epilogue.cuh), as gemm_sm90.cuh's.
template <int kStages, int kSegments, bool kHasBias, int kGranularity, class kQkvEpilogue = NoQkvEpilogue>
struct GemmSm90Fp8Traits {
  using Params = GemmSm90Fp8Params;
  using QkvEpilogue = kQkvEpilogue;
  static constexpr int block_m = kGemmSm90Fp8BlockM;
  static constexpr int block_n = kGemmSm90Fp8BlockN;
  static constexpr int block_k = kGemmSm90Fp8BlockK;  // codes per slot row = one scale block
  static constexpr int stages = kStages;
  static constexpr int segments = kSegments;
  static constexpr bool has_bias = kHasBias;
  static constexpr int granularity = kGranularity;
  // The promotion adds, and the row scales join the column scales in the epilogue.
  static constexpr bool token_scales = fp8_uses_token_scales(kGranularity);

  static constexpr int consumers = 2;
  static constexpr int threads = 128 * (1 + consumers);
  static constexpr int consumer_rows = block_m / consumers;  // 64: one wgmma M
  static constexpr int accumulators = block_n / 2;           // fp32 per consumer thread, thrice (partials)
  static constexpr int k_steps = block_k / 32;               // wgmma k32 steps per slot

  static constexpr int a_slot_bytes = block_m * block_k;  // [128, 128] e4m3
  static constexpr int b_slot_bytes = block_n * block_k;  // [128, 128] e4m3
  static constexpr int slot_bytes = a_slot_bytes + b_slot_bytes;
  static constexpr int ring_bytes = stages * slot_bytes;
  static constexpr int dynamic_shared_bytes = gemm_sm90_fp8_dynamic_shared_bytes(stages);

  static constexpr int producer_registers = 40;
  static constexpr int consumer_registers = 232;
  static constexpr unsigned empty_arrivals = 4 * consumers;  // one per consumer warp
  static constexpr int group_m = 8;

  static_assert(block_k == kFp8ActivationGroup, "a slot must be exactly one activation scale group");
  static_assert(block_k == 128 && block_n == 128, "a slot must be exactly one 128x128 weight scale block");
  static_assert(block_k == sm90::kSwizzle128Bytes, "a slot row is one 128-byte swizzle row");
  static_assert(stages >= 2, "the ring needs at least two slots");
  static_assert(kSegments >= 1 && kSegments <= kMaxGemmSegments, "1 to 3 weight segments");
  static_assert(kGranularity >= 0 && kGranularity <= 2, "tensor, channel or block weight scales");
  static_assert(a_slot_bytes % sm90::kSwizzle128AtomBytes == 0 &&
                    b_slot_bytes % sm90::kSwizzle128AtomBytes == 0,
                "every slot must start 1024-byte aligned");
  static_assert(dynamic_shared_bytes <= 227 * 1024, "more shared memory than an H100/H200 SM gives a CTA");
  static_assert(consumer_rows == kGemmSm90StoreBox, "a staging box holds a consumer warpgroup's 64 rows");
  static_assert(producer_registers * 128 + consumer_registers * 128 * consumers <=
                    gemm_sm90_launch_registers(threads),
                "setmaxnreg targets exceed the registers the CTA launched with");
};

// What a K block's promotion multiplies by: the activation scales of a consumer thread's two rows and the
// weight block's scale (block-scaled weights; with token scales the promotion multiplies by nothing).
struct Fp8BlockFactors {
  float row0, row1, weight;
};

// A ring slot and the parity of the pass over the ring that fills it, advanced one K block at a time: the
// consumers' loop then spends no `% stages` and `/ stages` per block (a multiply-high, shifts and a
// multiply-subtract at 6 stages, in vector registers where the slot addressed the empty barrier).
template <int kStages>
struct RingPosition {
  int slot = 0;
  unsigned phase = 0;
  __device__ __forceinline__ void advance() {
    if (++slot == kStages) {
      slot = 0;
      phase ^= 1u;
    }
  }
};

// A consumer warpgroup's next `count` K blocks into `accumulator`, from ring position `position` (advanced
// past them): the blocks sit in consecutive slots as the producer fills them; each one's 4 wgmma k32 go
// into a fresh partial (the first overwrites: no zeroing between blocks), and once they complete the slot
// is freed and the partial, times its factors, added to the accumulator. Blocks in pairs, so each partial
// is a fixed register array: even blocks in partial_a, odd ones in partial_b; wait_group 1 leaves only the
// block just issued in flight. Straight-line pairs with the last block or two peeled: with the pair's
// second half under a branch inside the loop, ptxas could not tell which partial was still in flight and
// serialized every wgmma (C7514).
//
// factors.next(): the next block's factors (past the last block it repeats the last one's, unused), asked
// for two blocks before the promotion that multiplies by them: loaded as the block itself was issued, an
// L2 round trip outlasted the block's wgmmas and the promotion's FFMAs waited on it (Nsight Compute,
// session 11: 28% of the stall samples, long scoreboard).
//
// before_last_wait(): with an even number of blocks, called once the last block is issued and every other
// one promoted, before the wait for the last: the epilogue's loads issued there run under the last block's
// wgmmas, in partial_a's registers, free by then; with an odd number, after the last promotion.
template <class Traits, class Factors, class BeforeLastWait>
__device__ __forceinline__ void consume_blocks(RingPosition<Traits::stages>& position, int count,
                                               unsigned ring, unsigned full_barriers, unsigned empty_barriers,
                                               unsigned a_offset, int lane,
                                               float (&accumulator)[Traits::accumulators],
                                               float (&partial_a)[Traits::accumulators],
                                               float (&partial_b)[Traits::accumulators], Factors& factors,
                                               BeforeLastWait&& before_last_wait) {
  RingPosition<Traits::stages> released = position;  // the oldest block not yet promoted
  auto issue = [&](float(&partial)[Traits::accumulators]) {
    sm90::mbarrier_wait_parity(full_barriers + 8 * position.slot, position.phase);
    const unsigned a_slot = ring + position.slot * Traits::slot_bytes;
    const unsigned long long a_descriptor = sm90::kmajor_descriptor(a_slot + a_offset);
    const unsigned long long b_descriptor = sm90::kmajor_descriptor(a_slot + Traits::a_slot_bytes);
    sm90::fence_registers(partial);
    sm90::wgmma_fence();
#pragma unroll
    for (int step = 0; step < Traits::k_steps; ++step) {
      // k32 of e4m3 = 32 bytes along the row: +2 in the descriptor's >> 4 address field.
      sm90::wgmma_ss_fp8_n128(partial, a_descriptor + 2 * step, b_descriptor + 2 * step, step > 0);
    }
    sm90::wgmma_commit_group();
    position.advance();
  };
  auto promote = [&](float(&partial)[Traits::accumulators], const Fp8BlockFactors& block) {
    sm90::fence_registers(partial);
    const float factor0 = block.row0 * block.weight;
    const float factor1 = block.row1 * block.weight;
    if (lane == 0) sm90::mbarrier_arrive(empty_barriers + 8 * released.slot);
    released.advance();
#pragma unroll
    for (int j = 0; j < Traits::accumulators; ++j) {
      if constexpr (Traits::token_scales) {
        accumulator[j] += partial[j];
      } else {
        accumulator[j] = fmaf(partial[j], (j / 2) % 2 == 0 ? factor0 : factor1, accumulator[j]);
      }
    }
  };
  // `pending`: the factors of the block in flight; `ahead`: the next block's.
  Fp8BlockFactors pending = factors.next();
  Fp8BlockFactors ahead = factors.next();
  issue(partial_a);
  int i = 1;
  for (; i + 1 < count; i += 2) {
    Fp8BlockFactors after = factors.next();
    issue(partial_b);
    sm90::wgmma_wait_group<1>();
    promote(partial_a, pending);
    pending = ahead;
    ahead = after;
    after = factors.next();
    issue(partial_a);
    sm90::wgmma_wait_group<1>();
    promote(partial_b, pending);
    pending = ahead;
    ahead = after;
  }
  if (i < count) {  // an even number of blocks: the last one is odd
    issue(partial_b);
    sm90::wgmma_wait_group<1>();
    promote(partial_a, pending);
    before_last_wait();
    sm90::wgmma_wait_group<0>();
    promote(partial_b, ahead);
  } else {
    // partial_a's block is the one in flight here and partial_b's registers are free, while on the other
    // path it is the other way round: so that the loads land in the same registers on both paths
    // (otherwise ptxas keeps them apart and spills), this path loads after its last promotion.
    sm90::wgmma_wait_group<0>();
    promote(partial_a, pending);
    before_last_wait();
  }
}

// The promotion factors of a consumer thread's two rows under block-scaled weights, K block after K block:
// the activation scales (row r of block k at a_scales[k a_scale_ld + r]) and the weight block's scale (the
// tile's row of [ceil(rows / 128), k_tiles]). One 32-bit offset, stepped and clamped to the last block by one
// instruction per block, so the reads past the last block repeat its factors (unused) and the loop spends no
// 64-bit index arithmetic on them; a_scale_ld x ceil(K / 128) < 2^31 floats (8 GiB of scales).
struct Fp8FactorStream {
  const float* row0;    // a_scales + the thread's first row
  const float* row1;    // a_scales + its second row
  const float* weight;  // the tile's row of weight block scales
  int offset;           // k a_scale_ld for the next block k
  int step;             // a_scale_ld
  int last;             // (k_tiles - 1) a_scale_ld
  int block;            // k, for the weight block scale
  int last_block;       // k_tiles - 1

  // The stream from K block 0 for the rows at a_scales + row0 and + row1 and the weight scales' row
  // `weight` of [ceil(rows / 128), k_tiles].
  static __device__ __forceinline__ Fp8FactorStream start(const float* a_scales, int row0, int row1,
                                                          int scale_ld, const float* weight, int k_tiles) {
    return {a_scales + row0, a_scales + row1, weight, 0, scale_ld, (k_tiles - 1) * scale_ld, 0, k_tiles - 1};
  }

  __device__ __forceinline__ Fp8BlockFactors next() {
    const Fp8BlockFactors factors{__ldg(row0 + offset), __ldg(row1 + offset), __ldg(weight + block)};
    offset = min(offset + step, last);
    block = min(block + 1, last_block);
    return factors;
  }
};

// Token scales: no factor per K block (the promotion adds).
struct Fp8NoFactors {
  __device__ __forceinline__ Fp8BlockFactors next() { return {1.0f, 1.0f, 1.0f}; }
};

// A consumer warpgroup's epilogue for the tile at (m0, n0), whose columns lie in `segment` (store_tile):
// tensor / channel weight scale, bias, one rounding, TMA stores.
// The column terms (channel or tensor scales, bias) are read by load_fp8_terms: with block-scaled weights
// (which read only a bias, if any) before the last K block's wait (consume_blocks' before_last_wait), so
// their L2 round trip runs under that block's wgmmas instead of between the main loop and the first store
// round, where both consumer warpgroups wait on it with the tensor cores idle; with token scales after the
// K loop, from lines prefetched into L1 (prefetch_token_terms says why).
//
// A tile inside N (every tile column but the last) reads from one address per array, each load an
// immediate offset from it, where an address per column pair took an IMAD.WIDE and a register pair each
// (32 a tile with channel scales).
template <class Traits>
__device__ __forceinline__ void load_fp8_terms(const GemmParams& gemm, int n0, const GemmSegment& segment,
                                               Fp8ColumnPair (&terms)[Traits::block_n / 8]) {
  constexpr int kBlocks = Traits::block_n / 8;
  if (n0 + Traits::block_n > gemm.n) {
    load_tile_terms<Traits::block_n>(
        n0, gemm,
        [&](int n, bool pair) {
          return fp8_column_pair<Traits::granularity, Traits::has_bias>(segment, n, pair);
        },
        terms);
    return;
  }
  // The thread's column pairs are column + 8 b of the segment (store_tile's layout).
  const int column = n0 + 2 * static_cast<int>(threadIdx.x % 4) - segment.n_begin;
#pragma unroll
  for (int b = 0; b < kBlocks; ++b)
    terms[b] = fp8_segment_columns<Traits::granularity, Traits::has_bias>(segment, column + 8 * b, true);
}

// Token scales: the lines the epilogue reads after the K loop (the tile's column scales and bias, the
// warpgroup's 64 row scales), asked into L1 as the tile starts by the first lanes of the warpgroup's first
// warp, a line each; the loads after the loop then hit L1 (nothing else this kernel does goes through L1
// to evict them: the ring and the stores are TMA's). Loaded into registers under the last block's wgmmas,
// as the block-scaled tiles' terms are, they spilled (20-136 bytes in the variants tried: with the
// promotion an add, ptxas keeps more of the last block's registers live there), and prefetched there,
// ptxas moved the last promotion past the final wait. A tile reaching past N loads its terms after the
// loop as they come (load_fp8_terms' checked path).
template <class Traits>
__device__ __forceinline__ void prefetch_token_terms(const GemmSm90Fp8Params& params, int n0,
                                                     const GemmSegment& segment, int first_row, int thread) {
  static_assert(Traits::token_scales && Traits::block_n == 128,
                "a tile's 128 column scales: 5 lines at most");
  const GemmParams& gemm = params.gemm;
  const int column = n0 - segment.n_begin;
  const unsigned char* line = nullptr;
  if (thread < 5) {  // 512 bytes of column scales from any 4-byte boundary
    if (Traits::granularity == 1 && n0 + Traits::block_n <= gemm.n)
      line = reinterpret_cast<const unsigned char*>(static_cast<const float*>(segment.scales) + column) +
             min(128 * thread, 511);
  } else if (thread >= 8 && thread < 11) {  // the warpgroup's 64 row scales, clamped to M
    const int row = min(first_row + 32 * (thread - 8), gemm.m - 1);
    line = reinterpret_cast<const unsigned char*>(params.a_scales + min(row, first_row + 63));
  } else if (Traits::has_bias && thread >= 16 && thread < 19) {  // 256 bytes of bias
    if (segment.bias != nullptr && n0 + Traits::block_n <= gemm.n)
      line = reinterpret_cast<const unsigned char*>(static_cast<const bf16_bits*>(segment.bias) + column) +
             min(128 * (thread - 16), 255);
  }
  if (line != nullptr) sm90::prefetch_l1(line);
}

// With token scales, `rows` holds the activation scales of the thread's two rows (read with the column
// terms): the accumulators are multiplied by them first.
//
// With the fused QKV postprocess the column scales are applied first, everywhere; apply_qkv_epilogue adds
// the bias of the heads it changes before their norm and RoPE, and the store adds the others' bias only.
template <class Traits>
__device__ __forceinline__ void store_fp8_tile(const GemmSm90Fp8Params& params, unsigned staging,
                                               int warpgroup, int m0, int n0,
                                               const Fp8ColumnPair (&terms)[Traits::block_n / 8],
                                               const float2& rows,
                                               const QkvTurns<typename Traits::QkvEpilogue>& turns,
                                               float (&accumulator)[Traits::accumulators]) {
  using QkvEpilogue = typename Traits::QkvEpilogue;
  if constexpr (Traits::token_scales) {
#pragma unroll
    for (int j = 0; j < Traits::accumulators; ++j) accumulator[j] *= (j / 2) % 2 == 0 ? rows.x : rows.y;
  }
  if constexpr (QkvEpilogue::enabled) {
    // Accumulator j: 8-column block j / 4, column pair element j % 2 (wgmma.cuh).
#pragma unroll
    for (int j = 0; j < Traits::accumulators; ++j)
      accumulator[j] *= j % 2 == 0 ? terms[j / 4].scale0 : terms[j / 4].scale1;
    apply_qkv_epilogue<QkvEpilogue, Traits::block_n, Traits::has_bias>(
        accumulator, turns, params.qkv_epilogue, n0, params.gemm.n, [&](int n) {
          const Fp8ColumnPair& column = terms[(n - n0) / 8];
          return make_float2(column.bias0, column.bias1);
        });
    const auto columns = preloaded_columns(n0, terms);
    store_tile<Traits::block_n>(
        params.c_map, staging, warpgroup, m0, n0, params.gemm, accumulator,
        [&](int n, bool pair) {
          const Fp8ColumnPair column = columns(n, pair);
          return QkvEpilogue::changes(n) ? make_float2(0.0f, 0.0f) : make_float2(column.bias0, column.bias1);
        },
        [](float2 bias, float value0, float value1) {
          return make_float2(value0 + bias.x, value1 + bias.y);
        });
  } else {
    (void)turns;
    store_tile<Traits::block_n>(
        params.c_map, staging, warpgroup, m0, n0, params.gemm, accumulator, preloaded_columns(n0, terms),
        [](const Fp8ColumnPair& column, float value0, float value1) { return column.apply(value0, value1); });
  }
}

// grid: [min(tiles, SMs)] persistent CTAs, block: [Traits::threads], dynamic shared memory:
// Traits::dynamic_shared_bytes.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads, 1)
    gemm_sm90_fp8_kernel(const __grid_constant__ GemmSm90Fp8Params params) {
#if ATTNPLAN_SM90A_ENABLED
  extern __shared__ __align__(1024) unsigned char shared[];
  const auto [ring, staging, unused, full_barriers, empty_barriers] =
      ring_layout<Traits::ring_bytes, Traits::stages>(shared);
  const GemmParams& gemm = params.gemm;

  // Broadcast from lane 0, so ptxas knows it is the same in every lane of the warp and keeps what is
  // derived from it (A's offset in a slot, so A's wgmma descriptors) in uniform registers.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  init_ring_barriers<Traits::stages, Traits::empty_arrivals>(full_barriers, empty_barriers);

  const int tiles_m = (gemm.m + Traits::block_m - 1) / Traits::block_m;
  const int tiles_n = (gemm.n + Traits::block_n - 1) / Traits::block_n;
  const int tiles = tiles_m * tiles_n;
  const int k_tiles = (gemm.k + Traits::block_k - 1) / Traits::block_k;

  if (warpgroup == 0) {
    // Producer, produce_ring's walk (gemm_sm90_ring.cuh): slot slot_use % stages, phase (slot_use / stages)
    // % 2. Not produce_ring itself: this one picks the weight segment once per tile, produce_ring's load per
    // slot, and the switch changes the PTX of a kernel verified on the H200 (a change to make with device
    // time).
    sm90::setmaxnreg_decrease<Traits::producer_registers>();
    if (threadIdx.x == 0) {
      prefetch_tensor_maps<Traits::segments>(params);
      int slot_use = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoordinates coordinates = grouped_tile<Traits::group_m>(tile, tiles_m, tiles_n);
        const int m0 = coordinates.m * Traits::block_m;
        const int n0 = coordinates.n * Traits::block_n;
        const SegmentTile w_tile = segment_tile<Traits::segments>(params, n0);
        for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ++slot_use) {
          const int slot = slot_use % Traits::stages;
          const unsigned phase = (slot_use / Traits::stages) & 1u;
          sm90::mbarrier_wait_parity(empty_barriers + 8 * slot, phase ^ 1u);
          const unsigned full = full_barriers + 8 * slot;
          const unsigned a_slot = ring + slot * Traits::slot_bytes;
          sm90::mbarrier_arrive_expect_tx(full, Traits::slot_bytes);
          sm90::tma_load_2d(a_slot, &params.a_map, full, k_tile * Traits::block_k, m0);
          sm90::tma_load_2d(a_slot + Traits::a_slot_bytes, w_tile.map, full, k_tile * Traits::block_k,
                            w_tile.row);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup c = 1, 2 owns tile rows [64 (c - 1), 64 c). Thread (warp w, lane l) holds rows
  // 16 w + l / 4 (accumulators j with (j / 2) % 2 == 0) and + 8 (the others) of its 64 (wgmma.cuh).
  sm90::setmaxnreg_increase<Traits::consumer_registers>();
  const int thread = threadIdx.x % 128;
  const int warp = thread / 32;
  const int lane = thread % 32;
  const unsigned a_offset = (warpgroup - 1) * Traits::consumer_rows * sm90::kSwizzle128Bytes;
  float accumulator[Traits::accumulators];
  // Two partials, so block k's wgmmas are in flight while block k - 1's partial is promoted: with one, each
  // K block ended in wgmma.wait_group 0 and the promotion, and the tensor cores ran only while the other
  // warpgroup had wgmmas queued (24% of the stall samples sat at that wait, kernels-notes.md).
  float partial_a[Traits::accumulators];
  float partial_b[Traits::accumulators];
#pragma unroll
  for (int j = 0; j < Traits::accumulators; ++j) partial_a[j] = partial_b[j] = 0.0f;

  RingPosition<Traits::stages> position;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const TileCoordinates coordinates = grouped_tile<Traits::group_m>(tile, tiles_m, tiles_n);
    const int m0 = coordinates.m * Traits::block_m;
    const int n0 = coordinates.n * Traits::block_n;
    const GemmSegment segment = segment_of<Traits::segments>(gemm, n0);
    const float* w_scales = static_cast<const float*>(segment.scales);
    const int row0 = m0 + (warpgroup - 1) * Traits::consumer_rows + 16 * warp + lane / 4;
    const int row1 = row0 + 8;
    // Rows past M hold zero codes; their scale is never read (and their results never stored).
    const int scale_row0 = row0 < gemm.m ? row0 : 0;
    const int scale_row1 = row1 < gemm.m ? row1 : 0;
#pragma unroll
    for (int j = 0; j < Traits::accumulators; ++j) accumulator[j] = 0.0f;

    // The fused QKV postprocess: this warpgroup's rotation-table rows into L2 now, into registers after the
    // K loop (gemm_sm90_qkv_epilogue.cuh).
    using QkvEpilogue = typename Traits::QkvEpilogue;
    if constexpr (QkvEpilogue::enabled) {
      if (thread == 0)
        prefetch_qkv_table<QkvEpilogue>(params.qkv_epilogue, m0 + (warpgroup - 1) * Traits::consumer_rows,
                                        gemm.m);
    }
    Fp8ColumnPair terms[Traits::block_n / 8];
    float2 rows = make_float2(1.0f, 1.0f);
    if constexpr (Traits::token_scales) {
      // Group 0 of the scales: the rows' one scale each, with the column terms after the K loop, from L1.
      prefetch_token_terms<Traits>(params, n0, segment, m0 + (warpgroup - 1) * Traits::consumer_rows, thread);
      Fp8NoFactors factors;
      consume_blocks<Traits>(position, k_tiles, ring, full_barriers, empty_barriers, a_offset, lane,
                             accumulator, partial_a, partial_b, factors, []() {});
      load_fp8_terms<Traits>(gemm, n0, segment, terms);
      rows = make_float2(__ldg(params.a_scales + scale_row0), __ldg(params.a_scales + scale_row1));
    } else {
      // Block weight scales of the tile's 128 rows: row (n0 - n_begin) / 128 of [ceil(rows / 128), k_tiles].
      auto factors = Fp8FactorStream::start(
          params.a_scales, scale_row0, scale_row1, static_cast<int>(params.a_scale_ld),
          w_scales + static_cast<long long>((n0 - segment.n_begin) / 128) * k_tiles, k_tiles);
      consume_blocks<Traits>(position, k_tiles, ring, full_barriers, empty_barriers, a_offset, lane,
                             accumulator, partial_a, partial_b, factors,
                             [&]() { load_fp8_terms<Traits>(gemm, n0, segment, terms); });
    }

    QkvTurns<QkvEpilogue> turns;
    if constexpr (QkvEpilogue::enabled)
      turns = load_qkv_turns<QkvEpilogue>(params.qkv_epilogue, row0, gemm.m);
    store_fp8_tile<Traits>(params, staging, warpgroup, m0, n0, terms, rows, turns, accumulator);
  }
  // The staging boxes must outlive their stores' reads (shared memory goes with the CTA).
  if (thread == 0) sm90::bulk_wait_group<0>();
#else
  (void)params;
  __trap();  // an sm_90a kernel instantiated for another target
#endif
}

}  // namespace attnplan::kernels
