// The sm_90a mixed-input projection GEMM: C[M, N] = X[M, K] · dequant(W)[N, K]^T (+ bias[N]) for 4-bit
// weights whose codes are stored in k order, two per byte, low nibble first: rows of bytes [N, K / 2]
// (mxfp4, nvfp4, MLX affine 4-bit) or GPTQ's words [K / 8, N] (4-bit, no act order); for AWQ's words
// [K, N / 8] (4-bit, packed along N: a thread gathers its pairs from two words); and for 8-bit e4m3fn
// weights, rows of bytes [N, K] (fp8 weight-only, mxfp8); bf16 activations, fp32 accumulation, one
// rounding to bf16 — gemm.cuh's semantics. ("w4" for the width it was written for.)
//
// wgmma reads its A operand from registers or shared memory and B from shared memory only, so the operands
// are swapped: a tile computes C^T[128 weight rows, block_tokens] = W'[128, K] · X[block_tokens, K]^T with
// the dequantized weights as the register A operand and the X slice, as TMA loads it, as the K-major B
// operand (the layout of CUTLASS's mixed-input Hopper GEMMs). The structure is gemm_sm90.cuh's: warpgroup 0
// produces (one thread streams X [block_tokens, 64] bf16 and the codes [128, 32 bytes] with TMA into a ring
// of `stages` slots with full/empty mbarriers), warpgroups 1 and 2 consume, each owning 64 weight rows; the
// CTA is persistent over tiles in grouped order.
//
// Consumer, per slot: each thread reads the 32 code bytes of its two fragment rows (r and r + 8) from
// shared memory, decodes the bytes its A fragments need for the four k16 steps with the format's
// code_pair / group_scale (gemm.cuh), rounds to bf16 pairs, and issues four wgmma m64n{block_tokens}k16
// (A from registers). Software-pipelined: the next slot is decoded into a second set of A registers
// while this slot's wgmmas run, and group scales come from global memory (L2) two slots ahead. Epilogue: C[m,
// n] from the transposed accumulator plus bias, one bf16 rounding.
//
// Tails: TMA zero-fills tokens past M, rows past a segment's end and K past K; their scales read as 0, so
// any M, any N and any K that is a multiple of 32 (16-byte rows of codes) and of the group size work.
// Every segment but the last must be a multiple of 128 rows wide (a tile must not straddle two).
//
// Compiles for every target; its body exists only for sm_90a (ATTNPLAN_SM90A_ENABLED) and traps elsewhere.
#pragma once

#include "attnplan/gemm.cuh"
#include "attnplan/gemm_sm90.cuh"
#include "attnplan/gemm_sm90_epilogue.cuh"
#include "attnplan/gemm_sm90_w4_params.h"
#include "attnplan/wgmma.cuh"

namespace attnplan::kernels {

// Whether a format stores its codes as GPTQ does: 32-bit words [K / 8, rows], word i of a row holding k
// 8 i .. 8 i + 7 at 4 bits each (the others: bytes [rows, K / 2], or AWQ's words below).
template <class Format>
inline constexpr bool k_major_words_v = requires {
  Format::k_major_words;
};

// Whether a format stores its codes as AWQ does: 32-bit words [K, rows / 8], a word holding one k of 8
// rows (in the format's nibble order).
template <class Format>
inline constexpr bool n_major_words_v = requires {
  Format::n_major_words;
};

// kFormat: a 4-bit policy of gemm.cuh with code_pair, group_scale (and group_offset where has_offset):
// Mxfp4Weights, Nvfp4Weights, AffineWeights<4, group> or GptqWeights<4, v2, group, false>.
template <int kBlockTokens, int kStages, int kSegments, bool kHasBias, class kFormat>
struct GemmSm90W4Traits {
  using Params = GemmSm90Params;
  using Format = kFormat;
  static constexpr int block_rows = kGemmSm90W4BlockRows;  // weight rows per tile (columns of C)
  static constexpr int block_tokens = kBlockTokens;        // tokens per tile (rows of C), the wgmma N
  static constexpr int block_k = kGemmSm90W4BlockK;        // K per ring slot
  static constexpr int stages = kStages;
  static constexpr int segments = kSegments;
  static constexpr bool has_bias = kHasBias;

  static constexpr int consumers = 2;                           // consumer warpgroups
  static constexpr int threads = 128 * (1 + consumers);         // producer warpgroup first
  static constexpr int consumer_rows = block_rows / consumers;  // 64: one wgmma M
  static constexpr int accumulators = block_tokens / 2;         // fp32 per consumer thread
  static constexpr int k_steps = block_k / 16;                  // wgmma k16 steps per slot

  static constexpr int x_slot_bytes = block_tokens * block_k * 2;  // [block_tokens, 64] bf16
  static constexpr int bits = Format::bits;                        // 4 or 8 bits per code
  static constexpr int code_row_bytes = block_k * bits / 8;        // 32 or 64: 64 codes of one weight row
  static constexpr int code_slot_bytes = block_rows * code_row_bytes;
  static constexpr int slot_bytes = x_slot_bytes + code_slot_bytes;
  static constexpr int ring_bytes = stages * slot_bytes;
  static constexpr int dynamic_shared_bytes = gemm_sm90_w4_dynamic_shared_bytes(block_tokens, stages, bits);

  // Codes: bytes [rows, K / 2] (a slot: [128, 32] bytes), or GPTQ words [K / 8, rows] (a slot: [8, 128]
  // words). Either way byte l % 4 of the slot's word 2 s (+ 1) of a row holds its k 16 s + 2 (l % 4) (+ 8).
  // 8-bit codes: bytes [rows, K] (a slot: [128, 64] bytes); the 16-bit half l % 2 of the row's word
  // 4 s + (l % 4) / 2 (+ 2) holds the same two k.
  static constexpr bool k_major_words = k_major_words_v<Format>;
  // AWQ words [K, rows / 8] (a slot: [64, 16] words): a thread's code of row r and k comes from word
  // (k, r / 8) alone, so each of its k takes one 4-byte load (the 8 row groups of a warp read the same word).
  static constexpr bool n_major_words = n_major_words_v<Format>;
  // Scales per weight row that one slot's 64 k touch, and the k16 steps one scale covers (a per-channel
  // group, -1, is one group longer than any K).
  static constexpr int group_size = Format::group_size > 0 ? Format::group_size : (1 << 30);
  static constexpr int scales_per_slot = group_size >= block_k ? 1 : block_k / group_size;
  static constexpr int steps_per_scale = k_steps / scales_per_slot;

  static constexpr int producer_registers = 40;
  static constexpr int consumer_registers = 232;
  static constexpr unsigned empty_arrivals = 4 * consumers;  // one per consumer warp
  static constexpr int group_tokens = 8;                     // token tiles per rasterization group

  static_assert(bits == 4 || (bits == 8 && !k_major_words && !n_major_words),
                "4-bit codes two per byte, or 8-bit bytes");
  static_assert(block_tokens == 128 || block_tokens == 256, "block_tokens is 128 or 256 (wgmma N, TMA box)");
  static_assert(stages >= 2, "the ring needs at least two slots");
  static_assert(kSegments >= 1 && kSegments <= kMaxGemmSegments, "1 to 3 weight segments");
  // A thread's four k of one k16 step (2c, 2c + 1, 2c + 8, 2c + 9) share one scale.
  static_assert(group_size % 16 == 0 && (block_k % group_size == 0 || group_size % block_k == 0),
                "groups of 16, 32, 64 or 128 k");
  static_assert(x_slot_bytes % sm90::kSwizzle128AtomBytes == 0 &&
                    slot_bytes % sm90::kSwizzle128AtomBytes == 0,
                "every X slice must start 1024-byte aligned (swizzle atoms, descriptor base offset 0)");
  static_assert(block_k * 2 == sm90::kSwizzle128Bytes, "an X slot row is one 128-byte swizzle row");
  static_assert(consumer_rows == kGemmSm90StoreBox, "a staging box holds a consumer warpgroup's 64 rows");
  static_assert(dynamic_shared_bytes <= 227 * 1024, "more shared memory than an H100/H200 SM gives a CTA");
  static_assert(producer_registers * 128 + consumer_registers * 128 * consumers <=
                    gemm_sm90_launch_registers(threads),
                "setmaxnreg targets exceed the registers the CTA launched with");
};

// grid: [min(tiles, SMs)] persistent CTAs, block: [Traits::threads], dynamic shared memory:
// Traits::dynamic_shared_bytes.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads, 1)
    gemm_sm90_w4_kernel(const __grid_constant__ GemmSm90Params params) {
#if ATTNPLAN_SM90A_ENABLED
  using Format = typename Traits::Format;
  extern __shared__ __align__(1024) unsigned char shared[];
  const auto [ring, staging, unused, full_barriers, empty_barriers] =
      ring_layout<Traits::ring_bytes, Traits::stages>(shared);
  const unsigned char* ring_pointer = shared + (ring - sm90::smem_address(shared));
  const GemmParams& gemm = params.gemm;

  // Broadcast from lane 0, so ptxas knows it is warp-uniform (what derives from it stays in uniform
  // registers).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  init_ring_barriers<Traits::stages, Traits::empty_arrivals>(full_barriers, empty_barriers);

  // Tile (token tile, weight tile): C rows [t * block_tokens, ...), columns [w * 128, ...).
  const int token_tiles = (gemm.m + Traits::block_tokens - 1) / Traits::block_tokens;
  const int row_tiles = (gemm.n + Traits::block_rows - 1) / Traits::block_rows;
  const int tiles = token_tiles * row_tiles;
  const int k_tiles = (gemm.k + Traits::block_k - 1) / Traits::block_k;

  if (warpgroup == 0) {
    // Producer: one thread issues every TMA load.
    sm90::setmaxnreg_decrease<Traits::producer_registers>();
    if (threadIdx.x == 0) {
      produce_ring<Traits::stages, Traits::slot_bytes, Traits::segments, Traits::group_tokens>(
          params, ring, full_barriers, empty_barriers, token_tiles, row_tiles, k_tiles,
          [&](TileCoordinates coordinates, int k_tile, unsigned x_slot, unsigned full) {
            const SegmentTile codes =
                segment_tile<Traits::segments>(params, coordinates.n * Traits::block_rows);
            sm90::tma_load_2d(x_slot, &params.a_map, full, k_tile * Traits::block_k,
                              coordinates.m * Traits::block_tokens);
            if constexpr (Traits::k_major_words) {  // x: the weight row, y: the word row (8 k each)
              sm90::tma_load_2d(x_slot + Traits::x_slot_bytes, codes.map, full, codes.row,
                                k_tile * Traits::block_k / 8);
            } else if constexpr (Traits::n_major_words) {  // x: the word column (8 rows each), y: k
              sm90::tma_load_2d(x_slot + Traits::x_slot_bytes, codes.map, full, codes.row / 8,
                                k_tile * Traits::block_k);
            } else {  // x: bytes along the row (two k per byte), y: the weight row
              sm90::tma_load_2d(x_slot + Traits::x_slot_bytes, codes.map, full,
                                k_tile * Traits::code_row_bytes, codes.row);
            }
          });
    }
    return;
  }

  // Consumers: warpgroup c = 1, 2 owns weight rows [64 (c - 1), 64 c) of the tile. Thread (warp w, lane l)
  // holds A fragment rows r = 64 (c - 1) + 16 w + l / 4 and r + 8, k 2 (l % 4) + {0, 1} and + 8 of each
  // k16 step: in a row's 32 code bytes of a slot, step s reads byte 8 s + l % 4 (k 16 s + 2 (l % 4) + {0, 1})
  // and byte 8 s + 4 + l % 4 (the + 8 pair), i.e. byte l % 4 of 32-bit words 2 s and 2 s + 1.
  sm90::setmaxnreg_increase<Traits::consumer_registers>();
  const int thread = threadIdx.x % 128;
  const int warp = thread / 32;
  const int lane = thread % 32;
  // Where a thread's code pair sits in a 32-bit word: byte l % 4 (4 bits), or half l % 2 (8 bits); AWQ's
  // pairs are assembled into the low byte.
  const int byte_shift = Traits::n_major_words ? 0 : Traits::bits == 4 ? 8 * (lane % 4) : 16 * (lane % 2);
  const int fragment_row = (warpgroup - 1) * Traits::consumer_rows + 16 * warp + lane / 4;  // of the tile
  float accumulator[Traits::accumulators];
#pragma unroll
  for (int j = 0; j < Traits::accumulators; ++j) accumulator[j] = 0.0f;

  int slot_use = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const TileCoordinates coordinates = grouped_tile<Traits::group_tokens>(tile, token_tiles, row_tiles);
    const int m0 = coordinates.m * Traits::block_tokens;
    const int n0 = coordinates.n * Traits::block_rows;
    const GemmSegment segment = segment_of<Traits::segments>(gemm, n0);
    const int width = segment.n_end - segment.n_begin;
    int row[2];  // the fragment rows within the segment
    bool row_valid[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row[h] = n0 - segment.n_begin + fragment_row + 8 * h;
      row_valid[h] = row[h] < width;
    }

    // Group scales (and affine offsets) of both rows for slot k_tile; 0 past the segment or past K
    // (where the codes are zero-filled too), so any k_tile may be asked for.
    struct Scales {
      float scale[2][Traits::scales_per_slot];
      float offset[2][Traits::scales_per_slot];
    };
    auto load_scales = [&](int k_tile, Scales& scales) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < Traits::scales_per_slot; ++j) {
          const int group = k_tile * Traits::block_k / Traits::group_size + j;
          const bool valid = row_valid[h] && group * Traits::group_size < gemm.k;
          // 1 / code_pair_unit is a power of two: exact unless the scale is within 2^14 of overflow
          // (E8M0 exponents above 241, far outside real checkpoints).
          scales.scale[h][j] =
              valid ? Format::group_scale(segment, row[h], group, gemm.k) * (1.0f / Format::code_pair_unit)
                    : 0.0f;
          if constexpr (Format::has_offset) {
            scales.offset[h][j] = valid ? Format::group_offset(segment, row[h], group, gemm.k) : 0.0f;
          } else {
            scales.offset[h][j] = 0.0f;
          }
        }
      }
    };
    // The tile's ring uses are first_use + k_tile.
    const int first_use = slot_use;
    slot_use += k_tiles;
    // Waits for slot k_tile and decodes its A fragments (wgmma.cuh wgmma_rs: [0] row r, k +0..; [1] row
    // r + 8; [2] row r, k + 8; [3] both) with that slot's scales.
    auto decode = [&](int k_tile, const Scales& scales, unsigned(&a)[Traits::k_steps][4]) {
      const int use = first_use + k_tile;
      sm90::mbarrier_wait_parity(full_barriers + 8 * (use % Traits::stages),
                                 static_cast<unsigned>(use / Traits::stages) & 1u);
      const unsigned char* codes =
          ring_pointer + (use % Traits::stages) * Traits::slot_bytes + Traits::x_slot_bytes;
      // The 8 code words of each fragment row (unswizzled).
      unsigned words[2][8];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (Traits::k_major_words) {  // [8, 128] words: a warp reads 8 consecutive words per load
          const unsigned* column = reinterpret_cast<const unsigned*>(codes) + fragment_row + 8 * h;
#pragma unroll
          for (int i = 0; i < 8; ++i) words[h][i] = column[i * Traits::block_rows];
        } else if constexpr (Traits::n_major_words) {
          // [64, 16] words: the codes of k 8 i + 2 (l % 4) and the next, at this row's nibble of word
          // (k, row / 8), make pair i.
          const unsigned* column = reinterpret_cast<const unsigned*>(codes) + (fragment_row + 8 * h) / 8;
          const int nibble_shift = 4 * Format::nibble_of_column(fragment_row % 8);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int k = 8 * i + 2 * (lane % 4);
            const unsigned low = (column[k * (Traits::block_rows / 8)] >> nibble_shift) & 15u;
            const unsigned high = (column[(k + 1) * (Traits::block_rows / 8)] >> nibble_shift) & 15u;
            words[h][i] = low | (high << 4);
          }
        } else if constexpr (Traits::bits == 4) {  // [128, 32] bytes, row-major
          const uint4* source =
              reinterpret_cast<const uint4*>(codes + (fragment_row + 8 * h) * Traits::code_row_bytes);
          const uint4 first = source[0];
          const uint4 second = source[1];
          words[h][0] = first.x, words[h][1] = first.y, words[h][2] = first.z, words[h][3] = first.w;
          words[h][4] = second.x, words[h][5] = second.y, words[h][6] = second.z, words[h][7] = second.w;
        } else {  // [128, 64] bytes, row-major: of the row's 16 words, 2 i + (l % 4) / 2 is this thread's i
          const uint4* source =
              reinterpret_cast<const uint4*>(codes + (fragment_row + 8 * h) * Traits::code_row_bytes);
          const bool odd = (lane & 2) != 0;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint4 four = source[q];
            words[h][2 * q] = odd ? four.y : four.x;
            words[h][2 * q + 1] = odd ? four.w : four.z;
          }
        }
      }
#pragma unroll
      for (int step = 0; step < Traits::k_steps; ++step) {
        const int j = step / Traits::steps_per_scale;
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // k + 0 (word 2 step) or k + 8 (word 2 step + 1)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // code_pair masks its byte (4 bits) or half word (8 bits)
            const unsigned byte = words[h][2 * step + half] >> byte_shift;
            a[step][2 * half + h] =
                dequantize_code_pair<Format>(byte, scales.scale[h][j], scales.offset[h][j]);
          }
        }
      }
    };

    // Software pipeline: slot k_tile + 1 is decoded while the wgmmas of slot k_tile run (two sets of A
    // registers), and the scales are fetched from L2 two slots ahead.
    Scales scales;       // of the next slot to decode
    Scales scales_next;  // of the one after
    unsigned a[Traits::k_steps][4];
    unsigned a_next[Traits::k_steps][4];
    load_scales(0, scales);
    load_scales(1, scales_next);
    decode(0, scales, a);
    scales = scales_next;
    load_scales(2, scales_next);
    for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
      const unsigned x_slot = ring + ((first_use + k_tile) % Traits::stages) * Traits::slot_bytes;
      const unsigned long long x_descriptor = sm90::kmajor_descriptor(x_slot);
      sm90::fence_registers(accumulator);
      sm90::wgmma_fence();  // orders the A registers and accumulators written above before the wgmmas
#pragma unroll
      for (int step = 0; step < Traits::k_steps; ++step) {
        // K step `step` starts 32 bytes further along the (unswizzled) X row: +2 in the >> 4 address field.
        sm90::wgmma_rs<Traits::block_tokens>(accumulator, a[step], x_descriptor + 2 * step,
                                             k_tile > 0 || step > 0);
      }
      sm90::wgmma_commit_group();
      if (k_tile + 1 < k_tiles) {
        decode(k_tile + 1, scales, a_next);
        scales = scales_next;
        load_scales(k_tile + 3, scales_next);
      }
      sm90::wgmma_wait_group<0>();
      sm90::fence_registers(accumulator);
      // a stays live (unreused by the compiler) until the wgmmas that read it have completed.
#pragma unroll
      for (int step = 0; step < Traits::k_steps; ++step) sm90::fence_registers(a[step]);
      // This warp's reads of the slot (codes: ordinary loads; X: the completed wgmmas) are done.
      if (lane == 0) sm90::mbarrier_arrive(empty_barriers + 8 * ((first_use + k_tile) % Traits::stages));
#pragma unroll
      for (int step = 0; step < Traits::k_steps; ++step) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[step][i] = a_next[step][i];
      }
    }

    // Epilogue (store_tile_transposed): d[j] is weight row fragment_row + 8 ((j / 2) % 2) and token
    // 8 (j / 4) + 2 (l % 4) + j % 2 of the tile (wgmma.cuh's D layout, transposed on the way to C[token,
    // row]). Bias in fp32, one rounding, TMA stores (rows past the segment's end lie past N: clipped). The
    // producer meanwhile already fills the ring for the next tile.
    float bias[2] = {0.0f, 0.0f};
    if constexpr (Traits::has_bias) {
      if (segment.bias != nullptr) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (row_valid[h])
            bias[h] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(segment.bias)[row[h]]);
        }
      }
    }
    store_tile_transposed<Traits::block_tokens>(params.c_map, staging, warpgroup, m0, n0, accumulator, bias);
  }
  // The staging boxes must outlive their stores' reads (shared memory goes with the CTA).
  if (thread == 0) sm90::bulk_wait_group<0>();
#else
  (void)params;
  __trap();  // an sm_90a kernel instantiated for another target
#endif
}

}  // namespace attnplan::kernels
