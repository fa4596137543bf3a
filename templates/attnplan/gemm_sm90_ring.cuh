// The ring of the warp-specialized sm_90a GEMMs (gemm_sm90.cuh, gemm_sm90_w4.cuh, gemm_sm90_decode.cuh,
// gemm_sm90_fp8.cuh): a producer fills `stages` shared-memory slots by TMA, consumers empty them, and each
// slot has a "full" and an "empty" mbarrier. Here: the barriers' setup, the weight segment's tensor map for
// a tile, and the producer's walk over the tiles (the fp8 kernel keeps its own walk, gemm_sm90_fp8.cuh).
//
// Compiles for every target; the kernels that call it exist only for sm_90a.
#pragma once

#include "attnplan/gemm.cuh"
#include "attnplan/gemm_sm90_params.h"
#include "attnplan/wgmma.cuh"

namespace attnplan::kernels {

// Every ring slot's "full" barrier (kFullArrivals: the producer's arrive_expect_tx, plus the TMA bytes;
// gemm_sm90_decode.cuh adds its decoder warps) and "empty" barrier (kEmptyArrivals: one per consumer
// warp), initialized by thread 0 and made visible to every thread and to the async proxy before anyone
// uses them. Call with the whole CTA.
template <int kStages, unsigned kEmptyArrivals, unsigned kFullArrivals = 1>
__device__ __forceinline__ void init_ring_barriers(unsigned full_barriers, unsigned empty_barriers) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(full_barriers + 8 * s, kFullArrivals);
      sm90::mbarrier_init(empty_barriers + 8 * s, kEmptyArrivals);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();
}

// The weight segment holding logical W row n0 (a tile's first row; tiles never straddle segments): its
// tensor map and n0's row within the segment.
struct SegmentTile {
  const void* map;
  int row;
};

template <int kSegments, class Params>
__device__ __forceinline__ SegmentTile segment_tile(const Params& params, int n0) {
  // Compile-time indices only: no local-memory copy of the arrays.
  SegmentTile tile{&params.w_maps[0], n0};
#pragma unroll
  for (int s = 1; s < kSegments; ++s) {
    if (n0 >= params.gemm.segments[s].n_begin)
      tile = {&params.w_maps[s], n0 - params.gemm.segments[s].n_begin};
  }
  return tile;
}

// A's and each weight segment's tensor maps, fetched ahead of the producer's first TMA load of them.
template <int kSegments, class Params>
__device__ __forceinline__ void prefetch_tensor_maps(const Params& params) {
  sm90::prefetch_tensor_map(&params.a_map);
#pragma unroll
  for (int s = 0; s < kSegments; ++s) sm90::prefetch_tensor_map(&params.w_maps[s]);
}

// The producer thread's walk: prefetches the tensor maps, then goes through the CTA's tiles (blockIdx.x,
// + gridDim.x, ... of tiles_m x tiles_n in grouped order) as its consumers do, and for each of a tile's
// k_tiles ring slots waits until the consumers released the slot's previous use (a fresh barrier passes
// parity 1), announces kSlotBytes on the slot's full barrier (TMA counts full boxes, zero fill included)
// and calls load(coordinates, k_tile, slot address, full barrier) to issue the slot's TMA loads.
// `slot_use` counts slot uses across tiles: slot slot_use % kStages, phase (slot_use / kStages) % 2.
template <int kStages, int kSlotBytes, int kSegments, int kGroup, int kClusterM = 1, class Load>
__device__ __forceinline__ void produce_ring(const GemmSm90Params& params, unsigned ring,
                                             unsigned full_barriers, unsigned empty_barriers, int tiles_m,
                                             int tiles_n, int k_tiles, Load&& load,
                                             unsigned cluster_rank = 0) {
  prefetch_tensor_maps<kSegments>(params);
  const TileWalk<kClusterM, kGroup> walk{tiles_m, tiles_n, cluster_rank};
  int slot_use = 0;
  for (int unit = walk.first(); unit < walk.units(); unit += walk.stride()) {
    const TileCoordinates coordinates = walk.tile(unit);
    for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ++slot_use) {
      const int slot = slot_use % kStages;
      const unsigned phase = (slot_use / kStages) & 1u;
      sm90::mbarrier_wait_parity(empty_barriers + 8 * slot, phase ^ 1u);
      const unsigned full = full_barriers + 8 * slot;
      sm90::mbarrier_arrive_expect_tx(full, kSlotBytes);
      load(coordinates, k_tile, ring + slot * kSlotBytes, full);
    }
  }
}

}  // namespace attnplan::kernels
