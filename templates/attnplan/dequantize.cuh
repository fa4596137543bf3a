// A quantized projection weight -> bf16 W [N, K] in global memory: the first half of the dequantized
// path, which long launches of a weight-only quantized projection take on sm_90a (plan::DequantizeSpec):
// the bf16 wgmma GEMM then reads W as it reads a bf16 checkpoint. At thousands of tokens the projection is
// compute-bound, and the bf16 kernel's rate beats decoding codes on the wgmma's critical path
// (gemm_sm90_w4.cuh); rewriting W costs one pass over N x K that the GEMM amortizes over M.
//
// Each CTA stages the packed bytes of a [64 rows, 64 k] tile in shared memory exactly as gemm.cuh's
// pipeline stages a W slice (16-byte row chunks, or the word tile of a word-copied format), then turns
// every 8 consecutive k of a row into 8 bf16 with the format's gemm.cuh policy (the same decode and the
// same one rounding as the mma.sync loaders) and stores them as one 16-byte vector. The decode, not HBM,
// limits this kernel (Nsight, docs/kernels-notes.md): the E2M1 and e4m3fn policies decode two codes per
// conversion (code_pair) from one 4- or 8-byte shared load.
#pragma once

#include "attnplan/gemm.cuh"

namespace attnplan::kernels {

template <int kSegments, class WeightPolicy>
struct DequantizeTraits {
  using Params = DequantizeParams;
  using Weights = WeightPolicy;
  static constexpr int segments = kSegments;
  static constexpr int block_rows = kDequantizeBlockRows;  // W rows per CTA
  static constexpr int block_k = kDequantizeBlockK;        // K per CTA
  static constexpr int threads = kDequantizeThreads;
  static constexpr int bits = WeightPolicy::bits;
  static constexpr bool word_copied = word_copied_v<WeightPolicy>;
  static constexpr int chunks_per_row = block_k / 8;  // 8-value output vectors per tile row
  // Row formats: 16-byte packed chunks per tile row (copy_packed_slice).
  static constexpr int packed_chunks_per_row = block_k * bits / 8 / 16;
  // The staged tile: [block_rows, block_k * bits / 8] bytes, or the word tile of a word-copied format.
  static constexpr int packed_bytes = block_rows * block_k * bits / 8;

  static_assert(bits < 16, "bf16 weights need no dequantization");
  static_assert(kSegments >= 1 && kSegments <= kMaxGemmSegments, "1 to 3 weight segments");
  static_assert(word_copied || packed_chunks_per_row >= 1, "a packed tile row is whole 16-byte chunks");
  static_assert(block_rows * chunks_per_row % threads == 0, "every thread stores the same vectors");

  // Which (tile row, 8-k chunk) output vector `v` (of block_rows * chunks_per_row) is. Most formats: a
  // warp takes 4 rows x 8 chunks, so its 16-byte stores fill four 128-byte runs of W. A policy that looks
  // up each k's group (GPTQ act order) gathers a scale and a zero per value from [groups, N] tensors: with
  // 8 chunks a warp's lanes would touch 8 groups x 4 rows per value (8 scale sectors, 8 zero sectors), so
  // it takes 16 rows x 2 chunks instead: 2 groups x 16 consecutive rows (64-byte scale runs, one zero
  // word per 8 rows), while each row's two chunks still fill one 32-byte sector of W.
  static constexpr bool gathers_groups = gathers_groups_v<WeightPolicy>;
  static_assert(!gathers_groups || (block_rows % 16 == 0 && chunks_per_row % 2 == 0),
                "the gathering layout takes 16 rows x 2 chunks per warp");
  __device__ static int2 output_vector(int v) {
    if constexpr (gathers_groups) {
      const int lane = v % 32, warp_block = v / 32;
      return make_int2(warp_block % (block_rows / 16) * 16 + lane % 16,
                       warp_block / (block_rows / 16) * 2 + lane / 16);
    } else {
      return make_int2(v / chunks_per_row, v % chunks_per_row);
    }
  }
};

// grid: [ceil(N / block_rows), ceil(K / block_k)], block: [Traits::threads], no dynamic shared memory.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) dequantize_kernel(const DequantizeParams params) {
  using Weights = typename Traits::Weights;
  __shared__ __align__(16) unsigned char packed[Traits::packed_bytes];
  const GemmParams& gemm = params.gemm;
  const int n0 = blockIdx.x * Traits::block_rows;
  const int k_offset = blockIdx.y * Traits::block_k;
  const unsigned packed_base = shared_address(packed);
  const void* const fallback = gemm.segments[0].weight;  // a valid address for the zero-byte copies

  // The packed tile, as gemm_kernel's stages hold a W slice (words or chunks past N or K land as zeros
  // and are never stored).
  if constexpr (Traits::word_copied) {
    static_assert(Weights::template tile_rows<Traits::block_rows, Traits::block_k> *
                          Weights::template tile_columns<Traits::block_rows, Traits::block_k> * 4 <=
                      Traits::packed_bytes,
                  "the word tile fits the staged bytes");
  }
  copy_packed_slice<Weights, Traits::block_rows, Traits::block_k, Traits::segments, Traits::threads>(
      packed_base, gemm, n0, k_offset, fallback);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // 8 k of one row per step -> one 16-byte store of W [n, k .. k + 8).
  for (int v = threadIdx.x; v < Traits::block_rows * Traits::chunks_per_row; v += Traits::threads) {
    const int2 vector = Traits::output_vector(v);
    const int row = vector.x;
    const int chunk = vector.y;
    const int n = n0 + row;
    const int k = k_offset + chunk * 8;
    if (n >= gemm.n || k >= gemm.k) continue;
    const GemmSegment segment = segment_of<Traits::segments>(gemm, n);
    float values[8];
    if constexpr (Traits::word_copied) {
      Weights::template dequantize<Traits::block_rows, Traits::block_k>(
          reinterpret_cast<const unsigned*>(packed), row, chunk * 8, segment, n - segment.n_begin, k, gemm.k,
          values);
    } else {
      const unsigned char* raw =
          packed + row * (Traits::block_k * Traits::bits / 8) + chunk * 8 * Traits::bits / 8;
      Weights::dequantize(raw, segment, n - segment.n_begin, k, gemm.k, values);
    }
    unsigned pairs[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(values[2 * e], values[2 * e + 1]);
      pairs[e] = *reinterpret_cast<const unsigned*>(&pair);
    }
    *reinterpret_cast<uint4*>(params.weight + static_cast<long long>(n) * gemm.k + k) =
        make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
  }
}

// Weights that look up each k's group (act-order GPTQ: the group of k is g_idx[k], in any order) gather a
// scale and a zero per value. dequantize_kernel's CTA of 64 x 64 reads them from global memory, three
// dependent loads per value (docs/kernels-notes.md, "Session 23"). This kernel's CTA takes [64 rows, 512 k]
// and first stages, for its rows, every group's scale and zero in shared memory: a float pair per (group,
// row), [groups, 64]. Each value then costs one shared load at an offset the CTA computed once per k
// (g_idx[k] * 64 pairs). The table is 4.5 bytes a group and row in global memory against 1 KiB of W per row
// written; plan::choose_dequantize takes this kernel for up to 192 groups (a 96 KiB table).
//
// A warp takes 16 rows x 2 chunks of 8 k, as dequantize_kernel's gathering layout: a half-warp reads one
// group's pairs of 16 consecutive rows (128 bytes, every bank once), and each row's two chunks fill a
// 32-byte sector of W. Every segment boundary is a multiple of 64 rows, so a CTA's rows share one segment
// (and its g_idx). The value is s * (q - z), the mma.sync policy's, computed as s * ((2^23 + q) - (2^23 +
// z)): both sums are exact in f32, so is their difference, and the product rounds once, as there.
template <int kSegments, class WeightPolicy, int kGroups>
struct DequantizeTableTraits {
  using Params = DequantizeParams;
  using Weights = WeightPolicy;
  static constexpr int segments = kSegments;
  static constexpr int groups = kGroups;  // ceil(K / group_size), or 1 per channel
  static constexpr int block_rows = kDequantizeTableBlockRows;
  static constexpr int block_k = kDequantizeTableBlockK;
  static constexpr int threads = kDequantizeThreads;
  static constexpr int bits = WeightPolicy::bits;
  static constexpr int per_word = 32 / bits;        // codes per 32-bit word, consecutive k of one row
  static constexpr int chunk_words = 8 / per_word;  // words per 8 k
  static constexpr int word_rows = block_k / per_word;
  static constexpr int chunks_per_row = block_k / 8;
  static constexpr int table_bytes = groups * block_rows * 8;
  static constexpr int words_bytes = word_rows * block_rows * 4;
  static constexpr int shared_bytes = dequantize_table_shared_bytes(groups, bits);
  // Output vectors per thread: 16 rows x 2 chunks per warp, the rows of a warp fixed across its steps.
  static constexpr int row_blocks = block_rows / 16;
  static constexpr int steps = block_rows * chunks_per_row / threads;

  static_assert(gathers_groups_v<WeightPolicy>, "a policy that looks up each k's group");
  static_assert(bits == 4 || bits == 8, "GPTQ packs 4 or 8 bits");
  static_assert(groups >= 1, "at least one group");
  static_assert(threads / 32 % row_blocks == 0, "the warps cover whole 16-row blocks");
  static_assert(block_rows * chunks_per_row % threads == 0, "every thread stores the same vectors");
  static_assert(block_rows % 32 == 0, "word rows of whole 16-byte copies and bank rows");
  static_assert(table_bytes + words_bytes + block_k * 4 == shared_bytes, "the host's shared-memory formula");

  // Where word column `column` of word row `word_row` is staged: columns XOR 16 in the word rows of odd
  // chunks of 8 k, so a warp's two half-warps (16 rows each of chunks 2p and 2p + 1) read different banks.
  // 16-byte copies of 4 columns stay whole.
  __device__ static int word_slot(int word_row, int column) {
    return word_row * block_rows + (column ^ (word_row / chunk_words % 2 * 16));
  }
};

// grid: [ceil(N / 64), ceil(K / 512)], block: [Traits::threads], dynamic shared memory Traits::shared_bytes.
// Every segment but the last spans a multiple of 64 rows (plan::DequantizeSpec::check).
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) dequantize_table_kernel(const DequantizeParams params) {
  using Weights = typename Traits::Weights;
  extern __shared__ __align__(16) unsigned char shared[];
  float2* const table = reinterpret_cast<float2*>(shared);  // [groups, block_rows]: (s, 2^23 + z)
  unsigned* const words = reinterpret_cast<unsigned*>(shared + Traits::table_bytes);  // [word_rows, 64]
  int* const group_offsets =  // [block_k]: byte offset of g_idx[k]'s table row
      reinterpret_cast<int*>(shared + Traits::table_bytes + Traits::words_bytes);
  const GemmParams& gemm = params.gemm;
  const int n0 = blockIdx.x * Traits::block_rows;
  const int k0 = blockIdx.y * Traits::block_k;
  const GemmSegment segment = segment_of<Traits::segments>(gemm, n0);
  const int width = segment.n_end - segment.n_begin;
  const int rows = min(Traits::block_rows, gemm.n - n0);  // rows of this CTA inside N (and its segment)

  // The code words: word rows k0 / per_word + r of qweight [K / per_word, width], the CTA's 64 columns,
  // in 16-byte copies of 4 rows (N is a multiple of 8: a copy lies wholly inside or outside N). Outside
  // N or K: zeros, never stored.
  const unsigned words_base = shared_address(words);
  for (int v = threadIdx.x; v < Traits::word_rows * Traits::block_rows / 4; v += Traits::threads) {
    const int r = v / (Traits::block_rows / 4);
    const int column = v % (Traits::block_rows / 4) * 4;
    const bool copy = column < rows && (k0 / Traits::per_word + r) * Traits::per_word < gemm.k;
    const unsigned* source =
        reinterpret_cast<const unsigned*>(segment.weight) +
        (copy ? static_cast<long long>(k0 / Traits::per_word + r) * width + (n0 + column - segment.n_begin)
              : 0);
    cp_async_16(words_base + static_cast<unsigned>(Traits::word_slot(r, column)) * 4u, source, copy ? 16 : 0);
  }
  cp_async_commit();

  // Each k's table row. A g_idx outside [0, groups) (which the host refuses for checkpoints it reads)
  // is clamped, so a bad tensor reads a wrong scale, never outside the table.
#pragma unroll
  for (int kk = threadIdx.x; kk < Traits::block_k; kk += Traits::threads) {
    const int k = k0 + kk;
    const unsigned group = k < gemm.k ? static_cast<unsigned>(segment.g_idx[k]) : 0u;
    group_offsets[kk] =
        static_cast<int>(min(group, static_cast<unsigned>(Traits::groups - 1))) * (Traits::block_rows * 8);
  }
  // The table: every group's scale and zero (with v1's + 1) of the CTA's rows. A thread keeps one row
  // (threads is a multiple of block_rows) and loads the pairs of kBatch groups before it stores any, so
  // their L2 round trips overlap rather than follow one another.
  static_assert(Traits::threads % Traits::block_rows == 0, "a thread stages one row's pairs");
  constexpr int kGroupsPerStep = Traits::threads / Traits::block_rows;
  constexpr int kBatch = 8;
  const int staged_row = threadIdx.x % Traits::block_rows;
  const int row = n0 + staged_row - segment.n_begin;  // in the segment
  for (int first = threadIdx.x / Traits::block_rows; first < Traits::groups;
       first += kBatch * kGroupsPerStep) {
    float2 pairs[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int group = first + b * kGroupsPerStep;
      pairs[b] = make_float2(0.0f, 0.0f);
      if (group < Traits::groups && staged_row < rows) {
        pairs[b] = make_float2(group_major_scale(segment, row, group),
                               8388608.0f + Weights::zero_point(segment, row, group));
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int group = first + b * kGroupsPerStep;
      if (group < Traits::groups) table[group * Traits::block_rows + staged_row] = pairs[b];
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int r = warp % Traits::row_blocks * 16 + lane % 16;
  if (r >= rows) return;
  const unsigned char* const table_row = shared + r * 8;
  bf16_bits* const out = params.weight + static_cast<long long>(n0 + r) * gemm.k;
#pragma unroll 2
  for (int step = 0; step < Traits::steps; ++step) {
    const int chunk =
        (warp / Traits::row_blocks + step * (Traits::threads / 32 / Traits::row_blocks)) * 2 + lane / 16;
    const int k = k0 + chunk * 8;
    if (k >= gemm.k) break;  // chunks grow with the step
    const int4 offsets_low = reinterpret_cast<const int4*>(group_offsets)[chunk * 2];
    const int4 offsets_high = reinterpret_cast<const int4*>(group_offsets)[chunk * 2 + 1];
    const int offsets[8] = {offsets_low.x,  offsets_low.y,  offsets_low.z,  offsets_low.w,
                            offsets_high.x, offsets_high.y, offsets_high.z, offsets_high.w};
    unsigned codes[Traits::chunk_words];
#pragma unroll
    for (int w = 0; w < Traits::chunk_words; ++w)
      codes[w] = words[Traits::word_slot(chunk * Traits::chunk_words + w, r)];
    unsigned pairs[4];
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      float values[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        constexpr unsigned mask = (1u << Traits::bits) - 1u;
        const unsigned q =
            (codes[(e + h) / Traits::per_word] >> (Traits::bits * ((e + h) % Traits::per_word))) & mask;
        const float2 scale_zero = *reinterpret_cast<const float2*>(table_row + offsets[e + h]);
        values[h] = scale_zero.x * (__uint_as_float(0x4B000000u | q) - scale_zero.y);
      }
      const __nv_bfloat162 pair = __floats2bfloat162_rn(values[0], values[1]);
      pairs[e / 2] = *reinterpret_cast<const unsigned*>(&pair);
    }
    *reinterpret_cast<uint4*>(out + k) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
  }
}

}  // namespace attnplan::kernels
