// The fp8-activation projection GEMM for sm_89 (and any later arch): C[M, N] = A·W^T on the fp8 tensor
// cores through mma.sync m16n8k32 e4m3 x e4m3 -> fp32, over the codes and scales of the quantizers in
// gemm_sm90_fp8.cuh (rounding rule in gemm_sm90_fp8_params.h). sm_89 has neither wgmma nor TMA, so this
// is gemm.cuh's cp.async pipeline with the promotion of gemm_sm90_fp8.cuh: the mma products of one
// 128-wide K group (two K tiles of 64) go into a fresh fp32 `partial`, then partial * a_scale(row, group)
// [* w_scale(block, group) for 128x128 block weights] is added to the fp32 `accumulator` (with tensor and
// channel weight scales the activations have one scale per token: a_scale(row, 0) every time). Every scale is
// applied exactly in fp32 and the tensor cores' fp8 accumulation covers only 128 products. Tensor and
// channel weight scales are constant along K and are applied once, in the epilogue.
//
// Tails: cp.async zero-fills rows past M or past the segment's end and K past K (codes 0); K is a multiple
// of 16, so a 16-byte chunk is wholly inside or wholly past K. Any M, any N.
#pragma once

#include <cuda_bf16.h>

#include "attnplan/gemm.cuh"
#include "attnplan/gemm_fp8_epilogue.cuh"
#include "attnplan/gemm_sm89_fp8_params.h"
#include "attnplan/gemm_sm90_fp8_params.h"

namespace attnplan::kernels {

// accumulator[16x8] += a[16x32] · b[32x8] in e4m3 with fp32 accumulation. Fragments (PTX ISA, m16n8k32
// 8-bit types), g = lane / 4, t = lane % 4, 4 codes per register:
//   a[0]: row g, k 4t..4t+3       a[1]: row g + 8, k 4t..4t+3
//   a[2]: row g, k 16+4t..16+4t+3 a[3]: row g + 8, k 16+4t..16+4t+3
//   b[0]: column g, k 4t..4t+3    b[1]: column g, k 16+4t..16+4t+3
//   accumulator: row g, columns 2t, 2t + 1 ([0], [1]); row g + 8, the same columns ([2], [3]).
// A and B registers take k in the same order, so the products pair up whatever order within a k32 step
// the instruction gives the bytes of a register: only the rows (g, g + 8) and the column (g) must match.
__device__ __forceinline__ void mma_m16n8k32_e4m3(float (&accumulator)[4], const unsigned (&a)[4],
                                                  const unsigned (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  (void)accumulator;
  (void)a;
  (void)b;
  __trap();  // no fp8 tensor cores before sm_89
#endif
}

// kGranularity: the weight scales, as gemm_sm90_fp8.cuh's: 0 one f32 per tensor, 1 one f32 per row of W,
// 2 one f32 per 128x128 block ([ceil(rows / 128), ceil(K / 128)] per segment).
template <int kStages, int kSegments, bool kHasBias, int kGranularity>
struct GemmSm89Fp8Traits {
  using Params = GemmSm89Fp8Params;
  static constexpr int block_m = kGemmSm89Fp8BlockM;
  static constexpr int block_n = kGemmSm89Fp8BlockN;
  static constexpr int block_k = kGemmSm89Fp8BlockK;
  static constexpr int row_bytes = kGemmSm89Fp8RowBytes;  // padded shared-memory row of one tile
  static constexpr int stages = kStages;
  static constexpr int segments = kSegments;
  static constexpr bool has_bias = kHasBias;
  static constexpr int granularity = kGranularity;
  // Each promotion then multiplies by the row's one scale (the fp8 accumulation is still promoted every
  // 128 K).
  static constexpr bool token_scales = fp8_uses_token_scales(kGranularity);

  static constexpr int warps_m = 2;
  static constexpr int warps_n = 4;
  static constexpr int threads = 32 * warps_m * warps_n;
  static constexpr int warp_tile_m = block_m / warps_m;                  // 64
  static constexpr int warp_tile_n = block_n / warps_n;                  // 32
  static constexpr int mma_tiles_m = warp_tile_m / 16;                   // 4
  static constexpr int mma_tiles_n = warp_tile_n / 8;                    // 4
  static constexpr int k_steps = block_k / 32;                           // mma k32 steps per K tile
  static constexpr int tiles_per_group = kFp8ActivationGroup / block_k;  // K tiles per promotion

  static constexpr int chunks_per_row = block_k / 16;                // 16-byte cp.async chunks
  static constexpr int copies = block_m * chunks_per_row / threads;  // per thread, per operand
  static constexpr int a_stage_bytes = block_m * row_bytes;
  static constexpr int stage_bytes = (block_m + block_n) * row_bytes;
  static constexpr int dynamic_shared_bytes = gemm_sm89_fp8_dynamic_shared_bytes(stages);
  static constexpr int group_m = 8;  // grouped rasterization, as gemm.cuh

  static_assert(kFp8ActivationGroup % block_k == 0, "a K tile must lie inside one activation scale group");
  static_assert(block_n == 128, "a tile's weight rows must be one 128-row block of weight scales");
  static_assert(block_m == block_n, "A and W tiles share the copy loop");
  static_assert(block_m * chunks_per_row % threads == 0, "every thread copies the same number of chunks");
  static_assert(row_bytes % 16 == 0 && (row_bytes / 4) % 32 == 20,
                "16-byte aligned rows whose 4-byte words of 8 rows x 4 lanes fall in 32 distinct banks");
  static_assert(stages >= 2, "the pipeline needs at least two stages");
  static_assert(kSegments >= 1 && kSegments <= kMaxGemmSegments, "1 to 3 weight segments");
  static_assert(kGranularity >= 0 && kGranularity <= 2, "tensor, channel or block weight scales");
  static_assert(dynamic_shared_bytes <= 99 * 1024, "more shared memory than an sm_89 SM gives a CTA");
};

// grid: [ceil(M / 128) * ceil(N / 128)], block: [Traits::threads], dynamic shared memory:
// Traits::dynamic_shared_bytes. Every segment but the last is a multiple of 128 wide (GemmFp8Spec::check),
// so a tile's 128 weight rows come from one segment.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) gemm_sm89_fp8_kernel(const GemmSm89Fp8Params params) {
  extern __shared__ __align__(128) unsigned char shared[];
  const unsigned shared_base = shared_address(shared);
  const GemmParams& gemm = params.gemm;
  const int tiles_m = (gemm.m + Traits::block_m - 1) / Traits::block_m;
  const int tiles_n = (gemm.n + Traits::block_n - 1) / Traits::block_n;
  const TileCoordinates tile = grouped_tile<Traits::group_m>(blockIdx.x, tiles_m, tiles_n);
  const int m0 = tile.m * Traits::block_m;
  const int n0 = tile.n * Traits::block_n;
  const GemmSegment segment = segment_of<Traits::segments>(gemm, n0);
  const int w_row0 = n0 - segment.n_begin;  // the tile's first row of the segment's W
  const int segment_rows = segment.n_end - segment.n_begin;
  const unsigned char* w_codes = reinterpret_cast<const unsigned char*>(segment.weight);  // [rows, K]
  const int k_tiles = (gemm.k + Traits::block_k - 1) / Traits::block_k;
  const int groups = (gemm.k + kFp8ActivationGroup - 1) / kFp8ActivationGroup;

  // Stage s of the ring: A [128, 64] then W [128, 64], each row padded to row_bytes.
  const auto load_stage = [&](int k_tile) {
    const unsigned a_stage =
        shared_base + static_cast<unsigned>((k_tile % Traits::stages) * Traits::stage_bytes);
    const unsigned b_stage = a_stage + Traits::a_stage_bytes;
#pragma unroll
    for (int i = 0; i < Traits::copies; ++i) {
      const int index = static_cast<int>(threadIdx.x) + i * Traits::threads;
      const int row = index / Traits::chunks_per_row;
      const int chunk = index % Traits::chunks_per_row;
      const int k = k_tile * Traits::block_k + 16 * chunk;
      const unsigned offset = static_cast<unsigned>(row * Traits::row_bytes + 16 * chunk);
      const bool a_inside = k < gemm.k && m0 + row < gemm.m;
      const unsigned char* a_source =
          params.a_codes + (a_inside ? static_cast<long long>(m0 + row) * params.ld_codes + k : 0);
      cp_async_16(a_stage + offset, a_source, a_inside ? 16 : 0);
      const bool w_inside = k < gemm.k && w_row0 + row < segment_rows;
      const unsigned char* w_source =
          w_codes + (w_inside ? static_cast<long long>(w_row0 + row) * gemm.k + k : 0);
      cp_async_16(b_stage + offset, w_source, w_inside ? 16 : 0);
    }
  };

  // Prologue: stages - 1 tiles in flight; one commit per slot, empty or not, keeps wait_group uniform.
#pragma unroll
  for (int s = 0; s < Traits::stages - 1; ++s) {
    if (s < k_tiles) load_stage(s);
    cp_async_commit();
  }

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;  // fragment row (A) / column (B, C)
  const int t = lane % 4;  // fragment 4-byte column of k (A, B) / column pair (C)
  const int warp_row = warp / Traits::warps_n * Traits::warp_tile_m;
  const int warp_col = warp % Traits::warps_n * Traits::warp_tile_n;
  // [mma tile m][mma tile n][4] in the C fragment layout (mma_m16n8k32_e4m3).
  float accumulator[Traits::mma_tiles_m][Traits::mma_tiles_n][4] = {};
  float partial[Traits::mma_tiles_m][Traits::mma_tiles_n][4] = {};
  const float* w_scales = static_cast<const float*>(segment.scales);
  // Block weight scales of the tile's 128 rows: row w_row0 / 128 of [ceil(rows / 128), groups].
  const float* w_block_scales = w_scales + static_cast<long long>(w_row0 / 128) * groups;

  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    // Tile k_tile has landed for this thread's copies; the barrier makes every thread's copies visible
    // and certifies that all warps are done with the stage the next load overwrites.
    cp_async_wait<Traits::stages - 2>();
    __syncthreads();
    if (k_tile + Traits::stages - 1 < k_tiles) load_stage(k_tile + Traits::stages - 1);
    cp_async_commit();

    const unsigned char* a_tile = shared + (k_tile % Traits::stages) * Traits::stage_bytes;
    const unsigned char* b_tile = a_tile + Traits::a_stage_bytes;
#pragma unroll
    for (int step = 0; step < Traits::k_steps; ++step) {
      unsigned a[Traits::mma_tiles_m][4];
      unsigned b[Traits::mma_tiles_n][2];
#pragma unroll
      for (int i = 0; i < Traits::mma_tiles_m; ++i) {
        const unsigned char* row = a_tile + (warp_row + 16 * i + g) * Traits::row_bytes + 32 * step + 4 * t;
        a[i][0] = *reinterpret_cast<const unsigned*>(row);
        a[i][1] = *reinterpret_cast<const unsigned*>(row + 8 * Traits::row_bytes);
        a[i][2] = *reinterpret_cast<const unsigned*>(row + 16);
        a[i][3] = *reinterpret_cast<const unsigned*>(row + 8 * Traits::row_bytes + 16);
      }
#pragma unroll
      for (int j = 0; j < Traits::mma_tiles_n; ++j) {
        const unsigned char* row = b_tile + (warp_col + 8 * j + g) * Traits::row_bytes + 32 * step + 4 * t;
        b[j][0] = *reinterpret_cast<const unsigned*>(row);
        b[j][1] = *reinterpret_cast<const unsigned*>(row + 16);
      }
#pragma unroll
      for (int i = 0; i < Traits::mma_tiles_m; ++i) {
#pragma unroll
        for (int j = 0; j < Traits::mma_tiles_n; ++j) mma_m16n8k32_e4m3(partial[i][j], a[i], b[j]);
      }
    }

    // Promotion at the end of each 128-wide group (and of K): rows past M get factor 0, never stored.
    if (k_tile % Traits::tiles_per_group == Traits::tiles_per_group - 1 || k_tile == k_tiles - 1) {
      const int group = k_tile / Traits::tiles_per_group;
      const float* a_scales = params.a_scales + (Traits::token_scales ? 0 : group * params.a_scale_ld);
      float w_scale = 1.0f;
      if constexpr (Traits::granularity == 2) w_scale = __ldg(w_block_scales + group);
#pragma unroll
      for (int i = 0; i < Traits::mma_tiles_m; ++i) {
        const int row0 = m0 + warp_row + 16 * i + g;
        const float factor0 = row0 < gemm.m ? __ldg(a_scales + row0) * w_scale : 0.0f;
        const float factor1 = row0 + 8 < gemm.m ? __ldg(a_scales + row0 + 8) * w_scale : 0.0f;
#pragma unroll
        for (int j = 0; j < Traits::mma_tiles_n; ++j) {
          accumulator[i][j][0] = fmaf(partial[i][j][0], factor0, accumulator[i][j][0]);
          accumulator[i][j][1] = fmaf(partial[i][j][1], factor0, accumulator[i][j][1]);
          accumulator[i][j][2] = fmaf(partial[i][j][2], factor1, accumulator[i][j][2]);
          accumulator[i][j][3] = fmaf(partial[i][j][3], factor1, accumulator[i][j][3]);
#pragma unroll
          for (int e = 0; e < 4; ++e) partial[i][j][e] = 0.0f;
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the CTA exits

  // Epilogue: tensor / channel weight scale, bias, one rounding, 4-byte stores of column pairs.
#pragma unroll
  for (int j = 0; j < Traits::mma_tiles_n; ++j) {
    const int n = n0 + warp_col + 8 * j + 2 * t;
    if (n >= gemm.n) continue;
    const bool pair = n + 1 < gemm.n;
    const Fp8ColumnPair column = fp8_column_pair<Traits::granularity, Traits::has_bias>(segment, n, pair);
#pragma unroll
    for (int i = 0; i < Traits::mma_tiles_m; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int m = m0 + warp_row + 16 * i + g + 8 * half;
        if (m >= gemm.m) continue;
        store_fp8_columns(gemm.c + static_cast<long long>(m) * gemm.ldc + n, column,
                          accumulator[i][j][2 * half], accumulator[i][j][2 * half + 1], pair);
      }
    }
  }
}

}  // namespace attnplan::kernels
