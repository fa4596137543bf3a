// The bf16 projection GEMM for sm_90a (Hopper): C[M, N] = A[M, K] · W[N, K]^T (+ bias[N]), fp32
// accumulation, bias added in fp32, one rounding to bf16 — the semantics of gemm.cuh, faster.
//
// Warp-specialized, persistent. A CTA of three warpgroups walks tiles of C [128, block_n] (grouped
// rasterization, as gemm.cuh): warpgroup 0 is the producer, whose one elected thread streams [128, 64]
// slices of A and [block_n, 64] slices of W with TMA into a `stages`-deep ring of 128-byte-swizzled shared
// memory; warpgroups 1 and 2 are consumers that multiply their 64 rows of the slice with wgmma
// m64n{block_n}k16 (both operands from shared memory, K-major: W [N, K] row-major is exactly wgmma's
// K-major B) and write their [64, block_n] of C by TMA stores from two staging boxes each
// (gemm_sm90_epilogue.cuh), which drain while the next tile's wgmmas run. Each ring slot has a "full"
// mbarrier (the producer's expect_tx arrival + the TMA bytes) and an "empty" one (one arrival per consumer
// warp once the wgmmas that read the slot have completed). setmaxnreg moves registers from the producer (40)
// to the consumers (232), which hold block_n / 2 fp32 accumulators each.
//
// Clusters (cluster_m = 2): two CTAs of a cluster take two vertically adjacent tiles of the same W columns,
// so they need the same W slices: each producer loads its own A slice and half of the W slice, multicast
// into both CTAs' ring (TMA multicast), which halves the W bytes each SM pulls from L2 (48 KiB -> 32 KiB
// per slot at block_n 256). A slot is refilled only when both CTAs' consumers released it: every consumer
// warp arrives on the empty barrier of both CTAs. Both CTAs walk the same tile pairs (the second one's
// tile past M, for an odd number of row tiles, computes on clamped rows and stores nothing).
//
// Tails: TMA writes zeros for rows past M or past a segment's end and for K past K, so any M, any N and any
// K that is a multiple of 8 (16-byte global rows, a TMA requirement) work. Segments: one tensor map per
// segment. A 128- or 256-wide tile must not straddle a segment boundary, so every segment but the last must
// be a multiple of block_n wide (plan::GemmSpec checks it; the heuristic falls back to gemm.cuh otherwise).
// A 160- or 192-wide tile may: its W slice comes in 32-row pieces, each from its own segment's map, and the
// bias is looked up per column (every segment but the last a multiple of 32; gemm_sm90_tiles_straddle).
//
// Compiles for every target; its body exists only for sm_90a (ATTNPLAN_SM90A_ENABLED) and traps elsewhere.
#pragma once

#include "attnplan/common.cuh"
#include "attnplan/gemm.cuh"
#include "attnplan/gemm_sm90_epilogue.cuh"
#include "attnplan/gemm_sm90_params.h"
#include "attnplan/gemm_sm90_qkv_epilogue.cuh"
#include "attnplan/gemm_sm90_ring.cuh"
#include "attnplan/wgmma.cuh"

namespace attnplan::kernels {

// What a column without a bias reads (bf16 zero), so that bias loads need no branch (consume_tiles).
// `inline`, not `static`: NVRTC names an internal-linkage variable with a per-compile random tag
// (_INTERNAL_..._<hex>), so every compile of the same kernel gave a different cubin and the concurrency
// tests' serial and parallel caches disagreed.
__device__ inline const unsigned short kNoBias = 0;
__device__ __forceinline__ float2 bias_float2(float2 terms) {
  return terms;
}
__device__ __forceinline__ float2 bias_float2(__nv_bfloat162 bits) {
  return __bfloat1622float2(bits);
}

// kQkvEpilogue: NoQkvEpilogue, or QkvEpilogueTraits<...> for a q|k|v projection whose epilogue applies the
// QKV postprocess (gemm_sm90_qkv_epilogue.cuh).
template <int kBlockN, int kStages, int kSegments, bool kHasBias, int kClusterM = 1,
          class kQkvEpilogue = NoQkvEpilogue>
struct GemmSm90Traits {
  using Params = GemmSm90Params;
  static constexpr int block_m = kGemmSm90BlockM;  // rows of C per tile: 2 consumer warpgroups x 64
  static constexpr int block_n = kBlockN;          // columns of C per tile, the wgmma N
  static constexpr int block_k = kGemmSm90BlockK;  // K per ring slot: one 128-byte swizzled row
  static constexpr int stages = kStages;
  static constexpr int segments = kSegments;
  static constexpr bool has_bias = kHasBias;
  // A store round's bias loads issued together, with no branch around each (consume_tiles' bias_terms):
  // 6% off gpt-oss-20b's q|k|v GEMM with bias at 8192 and 512 tokens (kernels-notes.md, "Session 31").
  // Off with the fused QKV epilogue, where most columns' bias is added before the norm and RoPE and the
  // store skips them by a branch (reading them all instead was 2-4% slower), and in the decoding kernel,
  // whose 128-register consumers spill with a round's 16 loads live.
  static constexpr bool bias_loads_together = !kQkvEpilogue::enabled;
  static constexpr int cluster_m = kClusterM;  // CTAs per cluster, along M, sharing W slices
  using QkvEpilogue = kQkvEpilogue;

  static constexpr int consumers = 2;                        // consumer warpgroups
  static constexpr int threads = 128 * (1 + consumers);      // producer warpgroup first
  static constexpr int consumer_rows = block_m / consumers;  // 64: one wgmma M
  static constexpr int accumulators = block_n / 2;           // fp32 per consumer thread: [64, block_n] / 128
  static constexpr int k_steps = block_k / 16;               // wgmma k16 steps per slot

  static constexpr int a_slot_bytes = block_m * block_k * 2;  // [128, 64] bf16
  static constexpr int b_slot_bytes = block_n * block_k * 2;  // [block_n, 64] bf16
  static constexpr int b_rows_per_cta = block_n / cluster_m;  // W rows each CTA of a cluster loads
  // Whether a tile may straddle two weight segments, and the W rows of one TMA box: the CTA's whole share,
  // or a 32-row piece inside one segment when tiles straddle.
  static constexpr bool straddles = kSegments > 1 && gemm_sm90_tiles_straddle(kBlockN);
  static constexpr int w_box_rows = gemm_sm90_w_box_rows(kBlockN, kClusterM, kSegments);
  static constexpr int slot_bytes = a_slot_bytes + b_slot_bytes;
  static constexpr int ring_bytes = stages * slot_bytes;
  static constexpr int dynamic_shared_bytes = gemm_sm90_dynamic_shared_bytes(block_n, stages);

  // Registers per thread after setmaxnreg: 128 x 40 + 256 x 232 = 64512, the 384 x 168 the CTA launched
  // with (the consumers' setmaxnreg.inc can only take what the producer's .dec gave back).
  static constexpr int producer_registers = 40;
  static constexpr int consumer_registers = 232;

  // Empty-barrier arrivals per phase: one per consumer warp of every CTA of the cluster.
  static constexpr unsigned empty_arrivals = 4 * consumers * cluster_m;

  static constexpr int group_m = 8;  // tile rows per rasterization group (grouped_tile)

  // Whether the consumers release each slot as soon as its own wgmmas complete (wait_group 0 per slot)
  // rather than a slot later (one group kept in flight while the next is issued). TMA refills a slot in
  // far less than a slice's wgmmas, so here the group in flight wins; the decoding kernel, whose
  // producers take longer per slot than the consumers, releases early (gemm_sm90_decode.cuh).
  static constexpr bool release_each_slot = false;

  // 64 and 96 only for the decoding kernel's short launches (gemm_sm90_decode.cuh): more CTAs at one or two
  // row tiles.
  static_assert(block_n == 64 || block_n == 96 || block_n == 128 || block_n == 160 || block_n == 192 ||
                    block_n == 256,
                "block_n is 64, 96, 128, 160, 192 or 256 (wgmma N, TMA box <= 256 rows)");
  static_assert(b_rows_per_cta % w_box_rows == 0 &&
                    (w_box_rows * block_k * 2) % sm90::kSwizzle128AtomBytes == 0,
                "a CTA's share of W is whole boxes, each starting on a swizzle atom");
  static_assert(stages >= 2, "the ring needs at least two slots");
  static_assert(kSegments >= 1 && kSegments <= kMaxGemmSegments, "1 to 3 weight segments");
  static_assert(cluster_m == 1 || cluster_m == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(group_m % cluster_m == 0, "a rasterization group holds whole clusters");
  static_assert(a_slot_bytes % sm90::kSwizzle128AtomBytes == 0 &&
                    b_slot_bytes % sm90::kSwizzle128AtomBytes == 0 &&
                    (b_rows_per_cta * block_k * 2) % sm90::kSwizzle128AtomBytes == 0,
                "every slot (and each CTA's share of W) must start 1024-byte aligned (swizzle atoms, "
                "descriptor base offset 0)");
  static_assert(block_k * 2 == sm90::kSwizzle128Bytes, "a slot row is one 128-byte swizzle row");
  static_assert(consumer_rows == kGemmSm90StoreBox, "a staging box holds a consumer warpgroup's 64 rows");
  static_assert(dynamic_shared_bytes <= 227 * 1024, "more shared memory than an H100/H200 SM gives a CTA");
  static_assert(producer_registers * 128 + consumer_registers * 128 * consumers <=
                    gemm_sm90_launch_registers(threads),
                "setmaxnreg targets exceed the registers the CTA launched with");
};

// The consumer warpgroups' side of the ring (this kernel and gemm_sm90_decode.cuh, whose producer decodes
// W into the same slots): warpgroup c = 1, 2 owns tile rows [64 (c - 1), 64 c) of every tile of the walk,
// multiplies each slot with wgmma (both operands from shared memory), releases it, and stores its rows
// (gemm_sm90_epilogue.cuh). Each slot holds A [128, 64] then W [block_n, 64], 128-byte swizzled.
template <class Traits>
__device__ __forceinline__ void consume_tiles(const GemmSm90Params& params, unsigned ring, unsigned staging,
                                              unsigned full_barriers, unsigned empty_barriers, int warpgroup,
                                              const TileWalk<Traits::cluster_m, Traits::group_m>& walk,
                                              int k_tiles) {
  constexpr bool clustered = Traits::cluster_m > 1;
  const GemmParams& gemm = params.gemm;
  sm90::setmaxnreg_increase<Traits::consumer_registers>();
  const int thread = threadIdx.x % 128;
  const int lane = thread % 32;
  const unsigned a_offset = (warpgroup - 1) * Traits::consumer_rows * sm90::kSwizzle128Bytes;
  float accumulator[Traits::accumulators];
#pragma unroll
  for (int j = 0; j < Traits::accumulators; ++j) accumulator[j] = 0.0f;

  // A slot is free again once every consumer warp of the cluster has released it: lane r of each warp
  // arrives on cluster rank r's barrier (one remote arrival per thread, in parallel).
  const bool releases = lane < Traits::cluster_m;
  const auto release = [&](int slot) {
    if constexpr (clustered) {
      sm90::mbarrier_arrive_cluster(empty_barriers + 8 * slot, static_cast<unsigned>(lane));
    } else {
      sm90::mbarrier_arrive(empty_barriers + 8 * slot);
    }
  };

  using QkvEpilogue = typename Traits::QkvEpilogue;
  int slot_use = 0;
  for (int unit = walk.first(); unit < walk.units(); unit += walk.stride()) {
    const TileCoordinates coordinates = walk.tile(unit);
    const int m0 = coordinates.m * Traits::block_m;
    const int n0 = coordinates.n * Traits::block_n;
    // The fused QKV postprocess: this warpgroup's rotation-table rows into L2 now, into registers before the
    // tile's last wgmmas complete (gemm_sm90_qkv_epilogue.cuh).
    const int warpgroup_row = m0 + (warpgroup - 1) * Traits::consumer_rows;
    const int first_row = warpgroup_row + 16 * (thread / 32) + lane / 4;  // and + 8: this thread's rows
    if constexpr (QkvEpilogue::enabled) {
      if (thread == 0) prefetch_qkv_table<QkvEpilogue>(params.qkv_epilogue, warpgroup_row, gemm.m);
    }

    // Main loop: one group of k_steps wgmmas per slot; at most one group in flight while the next slot's
    // group is issued, so the slot of the previous group is released as soon as that one completes.
    int previous_slot = -1;
    for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ++slot_use) {
      const int slot = slot_use % Traits::stages;
      const unsigned phase = (slot_use / Traits::stages) & 1u;
      sm90::mbarrier_wait_parity(full_barriers + 8 * slot, phase);
      const unsigned a_slot = ring + slot * Traits::slot_bytes;
      const unsigned long long a_descriptor = sm90::kmajor_descriptor(a_slot + a_offset);
      const unsigned long long b_descriptor = sm90::kmajor_descriptor(a_slot + Traits::a_slot_bytes);
      sm90::fence_registers(accumulator);
      sm90::wgmma_fence();
#pragma unroll
      for (int step = 0; step < Traits::k_steps; ++step) {
        // K step `step` starts 32 bytes further along the (unswizzled) row: +2 in the >> 4 address field.
        sm90::wgmma_ss<Traits::block_n>(accumulator, a_descriptor + 2 * step, b_descriptor + 2 * step,
                                        k_tile > 0 || step > 0);
      }
      sm90::wgmma_commit_group();
      if constexpr (Traits::release_each_slot) {
        sm90::wgmma_wait_group<0>();
        sm90::fence_registers(accumulator);
        if (releases) release(slot);
      } else {
        sm90::wgmma_wait_group<1>();
        sm90::fence_registers(accumulator);
        if (previous_slot >= 0 && releases) release(previous_slot);
        previous_slot = slot;
      }
    }
    QkvTurns<QkvEpilogue> turns;
    if constexpr (QkvEpilogue::enabled)
      turns = load_qkv_turns<QkvEpilogue>(params.qkv_epilogue, first_row, gemm.m);
    sm90::wgmma_wait_group<0>();
    sm90::fence_registers(accumulator);
    if (previous_slot >= 0 && releases) release(previous_slot);

    // Epilogue (store_tile): bias in fp32, one rounding to bf16, TMA stores through the staging boxes.
    // The producer meanwhile already fills the ring for the next tile.
    const GemmSegment segment = segment_of<Traits::segments>(gemm, n0);
    // Without straddling the tile (and so n, n + 1 < N) lies in one segment: every segment but the last
    // is a whole number of tiles wide. With it, each column pair looks up its own (segment boundaries are
    // even, so n and n + 1 share one).
    const __nv_bfloat16* bias = Traits::has_bias && segment.bias != nullptr
                                    ? reinterpret_cast<const __nv_bfloat16*>(segment.bias) - segment.n_begin
                                    : nullptr;
    // Column n's (and, with `pair`, n + 1's) bias. With Traits::bias_loads_together: bf16 bits read with
    // no branch (a missing bias reads kNoBias) and converted where they are added, so a store round's 16
    // loads are in flight together; with the null check and the conversion around each load, every
    // conversion waited for its load inside its own branch and the loads went one after another (the
    // SASS, kernels-notes.md "Session 30"). Without it: fp32 terms, each converted next to its load.
    const auto bias_terms = [&](int n, bool pair) {
      if constexpr (Traits::bias_loads_together) {
        __nv_bfloat162 bits{};
        if constexpr (Traits::has_bias) {
          const __nv_bfloat16* own = bias;
          if constexpr (Traits::straddles) {
            const GemmSegment segment_n = segment_of<Traits::segments>(gemm, n);
            own = segment_n.bias != nullptr
                      ? reinterpret_cast<const __nv_bfloat16*>(segment_n.bias) - segment_n.n_begin
                      : nullptr;
          }
          const __nv_bfloat16* no_bias = reinterpret_cast<const __nv_bfloat16*>(&kNoBias);
          bits.x = *(own != nullptr ? own + n : no_bias);
          bits.y = *(own != nullptr && pair ? own + n + 1 : no_bias);
        }
        return bits;
      } else {
        float2 terms = make_float2(0.0f, 0.0f);
        if constexpr (Traits::has_bias && Traits::straddles) {
          const GemmSegment own = segment_of<Traits::segments>(gemm, n);
          if (own.bias != nullptr) {
            const __nv_bfloat16* own_bias = reinterpret_cast<const __nv_bfloat16*>(own.bias) - own.n_begin;
            terms.x = __bfloat162float(own_bias[n]);
            if (pair) terms.y = __bfloat162float(own_bias[n + 1]);
          }
        } else if constexpr (Traits::has_bias) {
          if (bias != nullptr) {
            terms.x = __bfloat162float(bias[n]);
            if (pair) terms.y = __bfloat162float(bias[n + 1]);
          }
        }
        return terms;
      }
    };
    using BiasTerms = decltype(bias_terms(0, false));
    static_assert(!Traits::bias_loads_together || !QkvEpilogue::enabled,
                  "the branch-free bias loads would read the bias of heads the fused epilogue already has");
    // The fused QKV postprocess: the heads it changes get their bias there, before the norm and RoPE.
    if constexpr (QkvEpilogue::enabled) {
      apply_qkv_epilogue<QkvEpilogue, Traits::block_n, Traits::has_bias>(
          accumulator, turns, params.qkv_epilogue, n0, gemm.n,
          [&](int n) { return bias_float2(bias_terms(n, true)); });
    }
    store_tile<Traits::block_n>(
        params.c_map, staging, warpgroup, m0, n0, gemm, accumulator,
        // Without the fused epilogue changes(n) is a constant false: no branch around the loads.
        [&](int n, bool pair) { return QkvEpilogue::changes(n) ? BiasTerms{} : bias_terms(n, pair); },
        [](BiasTerms terms, float value0, float value1) {
          if constexpr (Traits::has_bias) {
            const float2 bias = bias_float2(terms);
            return make_float2(value0 + bias.x, value1 + bias.y);
          }
          (void)terms;
          return make_float2(value0, value1);
        });
  }
  // The staging boxes must outlive their stores' reads (shared memory goes with the CTA); waiting for the
  // writes too costs nothing at the end.
  if (thread == 0) sm90::bulk_wait_group<0>();
}

// grid: [min(tiles, SMs)] persistent CTAs, block: [Traits::threads], dynamic shared memory:
// Traits::dynamic_shared_bytes.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads, 1)
    gemm_sm90_kernel(const __grid_constant__ GemmSm90Params params) {
#if ATTNPLAN_SM90A_ENABLED
  extern __shared__ __align__(1024) unsigned char shared[];
  const auto [ring, staging, unused, full_barriers, empty_barriers] =
      ring_layout<Traits::ring_bytes, Traits::stages>(shared);
  const GemmParams& gemm = params.gemm;

  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  init_ring_barriers<Traits::stages, Traits::empty_arrivals>(full_barriers, empty_barriers);
  constexpr bool clustered = Traits::cluster_m > 1;
  // The other CTA's barriers must be initialized before this one multicasts into it or arrives on them.
  if constexpr (clustered) sm90::cluster_sync();
  const unsigned rank = clustered ? sm90::cluster_rank() : 0u;

  const int tiles_m = (gemm.m + Traits::block_m - 1) / Traits::block_m;
  const int tiles_n = (gemm.n + Traits::block_n - 1) / Traits::block_n;
  const int k_tiles = (gemm.k + Traits::block_k - 1) / Traits::block_k;
  const TileWalk<Traits::cluster_m, Traits::group_m> walk{tiles_m, tiles_n, rank};

  if (warpgroup == 0) {
    // Producer: one thread issues every TMA load.
    sm90::setmaxnreg_decrease<Traits::producer_registers>();
    if (threadIdx.x == 0) {
      produce_ring<Traits::stages, Traits::slot_bytes, Traits::segments, Traits::group_m, Traits::cluster_m>(
          params, ring, full_barriers, empty_barriers, tiles_m, tiles_n, k_tiles,
          [&](TileCoordinates coordinates, int k_tile, unsigned a_slot, unsigned full) {
            const int n0 = coordinates.n * Traits::block_n;
            if constexpr (Traits::straddles) {
              // The A slice, then this CTA's share of the W slice in 32-row pieces, each read through the
              // map of the segment it lies in (a piece past N reads zeros; clusters as below).
              const int m_tile = clustered ? min(coordinates.m, tiles_m - 1) : coordinates.m;
              sm90::tma_load_2d(a_slot, &params.a_map, full, k_tile * Traits::block_k,
                                m_tile * Traits::block_m);
              const int share = static_cast<int>(rank) * Traits::b_rows_per_cta;
#pragma unroll
              for (int piece = 0; piece < Traits::b_rows_per_cta; piece += Traits::w_box_rows) {
                const SegmentTile w_piece = segment_tile<Traits::segments>(params, n0 + share + piece);
                const unsigned destination =
                    a_slot + Traits::a_slot_bytes + (share + piece) * sm90::kSwizzle128Bytes;
                if constexpr (clustered) {
                  sm90::tma_load_2d_multicast(destination, w_piece.map, full, k_tile * Traits::block_k,
                                              w_piece.row,
                                              static_cast<unsigned short>((1u << Traits::cluster_m) - 1u));
                } else {
                  sm90::tma_load_2d(destination, w_piece.map, full, k_tile * Traits::block_k, w_piece.row);
                }
              }
            } else if constexpr (clustered) {
              const SegmentTile w_tile = segment_tile<Traits::segments>(params, n0);
              // The second CTA's tile past M (odd row tiles) reads the last tile's rows: any bytes do,
              // nothing of it is stored.
              const int m_tile = min(coordinates.m, tiles_m - 1);
              sm90::tma_load_2d(a_slot, &params.a_map, full, k_tile * Traits::block_k,
                                m_tile * Traits::block_m);
              // This CTA's share of the W slice, into the same place of every CTA's slot.
              const unsigned share = rank * Traits::b_rows_per_cta;
              sm90::tma_load_2d_multicast(a_slot + Traits::a_slot_bytes + share * sm90::kSwizzle128Bytes,
                                          w_tile.map, full, k_tile * Traits::block_k,
                                          w_tile.row + static_cast<int>(share),
                                          static_cast<unsigned short>((1u << Traits::cluster_m) - 1u));
            } else {
              const SegmentTile w_tile = segment_tile<Traits::segments>(params, n0);
              sm90::tma_load_2d(a_slot, &params.a_map, full, k_tile * Traits::block_k,
                                coordinates.m * Traits::block_m);
              sm90::tma_load_2d(a_slot + Traits::a_slot_bytes, w_tile.map, full, k_tile * Traits::block_k,
                                w_tile.row);
            }
          },
          rank);
    }
    // The other CTA may still multicast into this one's ring and arrive on its barriers until it is done.
    if constexpr (clustered) sm90::cluster_sync();
    return;
  }

  // Consumers: warpgroup c = 1, 2 owns tile rows [64 (c - 1), 64 c).
  consume_tiles<Traits>(params, ring, staging, full_barriers, empty_barriers, warpgroup, walk, k_tiles);
  if constexpr (clustered) sm90::cluster_sync();  // see the producer's
#else
  (void)params;
  __trap();  // an sm_90a kernel instantiated for another target
#endif
}

}  // namespace attnplan::kernels
