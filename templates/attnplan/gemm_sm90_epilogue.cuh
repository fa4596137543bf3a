// The epilogue the sm_90a GEMMs share (gemm_sm90.cuh, gemm_sm90_fp8.cuh; gemm_sm90_w4.cuh transposed): a
// consumer warpgroup's wgmma accumulators, rounded once to bf16, stored to C by TMA through shared memory.
#pragma once

#include <cuda_bf16.h>

#include "attnplan/common.cuh"
#include "attnplan/gemm_params.h"
#include "attnplan/gemm_sm90_params.h"
#include "attnplan/wgmma.cuh"

namespace attnplan::kernels {

// The rounds both epilogues below share, for consumer warpgroup `warpgroup` (1 or 2) of `kRounds` [64, 64]
// boxes: it alternates its two of the CTA's staging boxes at `staging` ([2 warpgroups][2] x 8 KiB,
// 1024-byte aligned), starting each tile at the first. Per round thread 0 first waits until the box's
// previous store has read it: two rounds ago, this tile's or the last one's, except at the start of a tile
// after an odd number of rounds (64-, 160- and 192-wide tiles), where the box's last store was the last
// tile's final one, the latest, so it waits for every store (which had the tile's whole main loop to
// read). Then the warpgroup syncs on named barrier `warpgroup` (no other user in these kernels),
// `fill(round, box)` writes the box, the writes are made visible to the async proxy, the warpgroup syncs
// again and thread 0 stores the box by TMA at C's (column, row) `at(round)` (an int2) and commits, so the
// warpgroup goes on while the stores drain. After the CTA's last tile the kernel must wait for all its
// stores (bulk_wait_group<0>).
template <int kRounds, class Fill, class At>
__device__ __forceinline__ void store_rounds(const TensorMap& c_map, unsigned staging, int warpgroup,
                                             Fill&& fill, At&& at) {
  const unsigned boxes = staging + (warpgroup - 1) * 2 * kGemmSm90StoreBoxBytes;  // this warpgroup's two
  const int thread = threadIdx.x % 128;
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    const unsigned box = boxes + (round % 2) * kGemmSm90StoreBoxBytes;
    if (thread == 0) {
      if (kRounds % 2 == 1 && round == 0) {
        sm90::bulk_wait_group_read<0>();
      } else {
        sm90::bulk_wait_group_read<1>();
      }
    }
    sm90::warpgroup_barrier(warpgroup);
    fill(round, box);
    sm90::fence_proxy_async_shared();
    sm90::warpgroup_barrier(warpgroup);
    if (thread == 0) {
      const int2 coordinates = at(round);
      sm90::tma_store_2d(&c_map, box, coordinates.x, coordinates.y);
      sm90::bulk_commit_group();
    }
  }
}

// The column terms (bias, weight scales: whatever `columns(n, pair)` reads) of the 8-column blocks
// first_block .. first_block + kBlocks - 1 of a tile, the thread's pair column0 + 8 block of each. Where
// the tile lies inside N (`inside`: all but the last tile column) nothing is checked, so the loads carry
// no branch region each (a region's set-up, the skip and the defaults cost ~10 instructions a column pair,
// with both consumer warpgroups in their epilogues and the tensor cores idle); otherwise columns past N
// hold zeros (clipped by the store) and read nothing.
template <int kBlocks, class Columns, class Terms>
__device__ __forceinline__ void load_column_terms(int column0, int first_block, bool inside, int n_end,
                                                  Columns&& columns, Terms (&terms)[kBlocks]) {
  if (inside) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) terms[b] = columns(column0 + 8 * (first_block + b), true);
  } else {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const int n = column0 + 8 * (first_block + b);
      terms[b] = n < n_end ? columns(n, n + 1 < n_end) : Terms{};
    }
  }
}

// The epilogue of a consumer warpgroup: its [64, kN] fp32 accumulators (wgmma.cuh's layout: thread (warp
// w, lane l) holds, per 8-column block b, the column pair 8 b + 2 (l % 4) + {0, 1} of rows 16 w + l / 4
// and + 8, as accumulator[4 b + 2 half + {0, 1}]) rounded once to bf16 and stored to C[M, N] (`c_map`:
// dims {N, M}, row stride ldc, box [64, 64], 128-byte swizzle). Per 8-column block, `columns(n, pair)`
// loads what the pair's values need (bias, weight scales) once for both rows, and `value(columns,
// accumulator0, accumulator1)` returns the float2 to round.
//
// Consumer warpgroup `warpgroup` (1 or 2) holds rows [64 (warpgroup - 1), + 64) of the tile at (m0, n0)
// and writes them in rounds of one [64, 64] box (stmatrix, 128-byte swizzle; store_rounds), so the
// warpgroup goes on to the next tile's wgmmas while the stores drain; TMA clips rows past M and columns
// past N (columns [N, ldc) untouched). A tile whose width is an odd multiple of 32 (160) ends with a box
// over its last 64 columns: columns [kN - 64, 64 (kRounds - 1)) are stored twice, with the same values, so
// no store reaches past the tile and one tensor map serves every box.
//
// Why not 4-byte stores straight from the registers (the first version): each such store of a warp
// touches 8 rows of C, both warpgroups wait for them at the end of every tile while the tensor cores
// idle, and trimming their instructions gained 2%; the TMA stores gained 7-16% (kernels-notes.md,
// "Step 3").
template <int kN, class Columns, class Value>
__device__ __forceinline__ void store_tile(const TensorMap& c_map, unsigned staging, int warpgroup, int m0,
                                           int n0, const GemmParams& gemm, const float (&accumulator)[kN / 2],
                                           Columns&& columns, Value&& value) {
  constexpr int kBox = kGemmSm90StoreBox;
  static_assert(kBox * 2 == sm90::kSwizzle128Bytes, "a box row is one 128-byte swizzle row");
  static_assert(kN % (kBox / 2) == 0 && kN >= kBox, "whole or half boxes per tile, at least one box");
  constexpr int kRounds = (kN + kBox - 1) / kBox;
  // Round r's box: tile columns [first_column(r), + 64).
  const auto first_column = [](int round) { return min(round * kBox, kN - kBox); };
  const int row_begin = m0 + (warpgroup - 1) * kBox;  // its 64 rows of the tile
  const int thread = threadIdx.x % 128;
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int column0 = n0 + 2 * (lane % 4);
  // Lane l addresses row l % 8 of stmatrix matrix l / 8: matrices 0 / 1 are rows 0-7 / 8-15 of the
  // warp's 16 (top / bottom halves) of one 8-column block, 2 / 3 the same of the next block.
  const int box_row = 16 * warp + lane % 8 + 8 * ((lane / 8) % 2);
  const unsigned row_address = static_cast<unsigned>(box_row * sm90::kSwizzle128Bytes);
  using Terms = decltype(columns(0, false));
  auto fill = [&](int round, unsigned box) {
    // The round's column pairs' terms first, so their loads (bias, weight scales) are in flight together:
    // loaded next to their use, one L2 round trip per 8-column block held the fp8 kernel's epilogue (28%
    // of its stall samples with channel scales, Nsight Compute, session 11).
    const int first_block = first_column(round) / 8;  // the box's first 8-column block of the tile
    Terms terms[kBox / 8];
    load_column_terms(column0, first_block, n0 + kN <= gemm.n, gemm.n, columns, terms);
#pragma unroll
    for (int pair_block = 0; pair_block < kBox / 16; ++pair_block) {
      const int block = first_block + 2 * pair_block;  // 8-column block of the tile
      unsigned packed[4];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const Terms& term = terms[2 * pair_block + b];
        const float2 top = value(term, accumulator[4 * (block + b)], accumulator[4 * (block + b) + 1]);
        const float2 bottom = value(term, accumulator[4 * (block + b) + 2], accumulator[4 * (block + b) + 3]);
        packed[2 * b] = pack_bf16(top.x, top.y);
        packed[2 * b + 1] = pack_bf16(bottom.x, bottom.y);
      }
      // 16-byte chunk (2 pair_block + lane / 16) of the box row, swizzled by row % 8 (= lane % 8).
      const unsigned chunk = static_cast<unsigned>((2 * pair_block + lane / 16) ^ (lane % 8));
      sm90::stmatrix_x4(box + row_address + chunk * 16, packed[0], packed[1], packed[2], packed[3]);
    }
  };
  store_rounds<kRounds>(c_map, staging, warpgroup, fill,
                        [&](int round) { return make_int2(n0 + first_column(round), row_begin); });
}

// store_tile's column terms of a whole tile ([kN / 8]: the pair 8 b + 2 (l % 4) of each 8-column block b
// a thread stores), read ahead of store_tile by a caller that can hide their latency (the fp8 GEMM, under
// its last K block's wgmmas); store_tile is then given `columns` = preloaded_columns(...).
template <int kN, class Columns, class Terms>
__device__ __forceinline__ void load_tile_terms(int n0, const GemmParams& gemm, Columns&& columns,
                                                Terms (&terms)[kN / 8]) {
  load_column_terms(n0 + 2 * (threadIdx.x % 4), 0, n0 + kN <= gemm.n, gemm.n, columns, terms);
}

// A `columns` for store_tile that returns load_tile_terms' terms: store_tile asks for n = column0 + 8 b
// with b a constant once its loops unroll, so the index folds to a constant and the terms stay in
// registers.
template <class Terms, int kBlocks>
__device__ __forceinline__ auto preloaded_columns(int n0, const Terms (&terms)[kBlocks]) {
  const int column0 = n0 + 2 * (threadIdx.x % 4);
  return [&terms, column0](int n, bool) { return terms[(n - column0) / 8]; };
}

// The mixed-input kernel's epilogue (gemm_sm90_w4.cuh), which computes C^T: a consumer warpgroup's
// [64 weight rows, kTokens] accumulators (the same wgmma layout, rows = weight rows = columns of C, columns
// = tokens = rows of C) plus bias[h] of its rows 16 w + l / 4 + 8 h, rounded once to bf16 and stored to
// C through the staging boxes as store_tile does (store_rounds: the same boxes, barrier and waits),
// transposed on the way into shared memory (stmatrix .trans): round r's box is tokens [64 r, 64 r + 64) x the
// warpgroup's 64 weight rows. The tile starts at token m0 and weight row n0; warpgroup `warpgroup` holds its
// weight rows [64 (warpgroup - 1), + 64).
template <int kTokens>
__device__ __forceinline__ void store_tile_transposed(const TensorMap& c_map, unsigned staging, int warpgroup,
                                                      int m0, int n0, const float (&accumulator)[kTokens / 2],
                                                      const float (&bias)[2]) {
  constexpr int kBox = kGemmSm90StoreBox;
  static_assert(kBox * 2 == sm90::kSwizzle128Bytes, "a box row is one 128-byte swizzle row");
  static_assert(kTokens % kBox == 0, "whole boxes per tile");
  const int column_begin = n0 + (warpgroup - 1) * kBox;  // its 64 weight rows (columns of C)
  const int thread = threadIdx.x % 128;
  const int warp = thread / 32;
  const int lane = thread % 32;
  // Matrix i = l / 8 of a stmatrix is (8-token block 2 p + i / 2, weight-row half i % 2) of the warp's 16
  // rows: stored transposed, its rows are the block's tokens and its 16 bytes the half's 8 weight rows,
  // chunk 2 w + i % 2 of the box row, swizzled by the row (token) % 8 = l % 8.
  const unsigned chunk = static_cast<unsigned>((2 * warp + (lane / 8) % 2) ^ (lane % 8));
  auto fill = [&](int round, unsigned box) {
#pragma unroll
    for (int pair_block = 0; pair_block < kBox / 16; ++pair_block) {
      const int block = round * (kBox / 8) + 2 * pair_block;  // 8-token block of the tile
      unsigned packed[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = 4 * (block + i / 2) + 2 * (i % 2);
        packed[i] = pack_bf16(accumulator[j] + bias[i % 2], accumulator[j + 1] + bias[i % 2]);
      }
      const int box_row = 16 * pair_block + 8 * (lane / 16) + lane % 8;  // token of the box
      sm90::stmatrix_x4_trans(box + static_cast<unsigned>(box_row * sm90::kSwizzle128Bytes) + chunk * 16,
                              packed[0], packed[1], packed[2], packed[3]);
    }
  };
  store_rounds<kTokens / kBox>(c_map, staging, warpgroup, fill,
                               [&](int round) { return make_int2(column_begin, m0 + round * kBox); });
}

}  // namespace attnplan::kernels
