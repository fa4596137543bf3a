// Variable-length paged attention for prefill (spec section 6), FlashAttention-2 style: one CTA owns
// block_m query rows of one (sequence, query head), walks the key tiles its mask can reach, and keeps
// an online softmax in fp32. Tensor cores through mma.sync m16n8k16 (bf16 in, fp32 accumulate) for both
// S = Q K^T and O += P V; operands move global -> shared with cp.async (K/V rows gathered through the
// block table, two stages so the next tile loads while this one computes) and shared -> registers with
// ldmatrix. Each warp owns 16 query rows, so rows never cross warps and the softmax needs only
// quad shuffles. Block-table reads run one tile ahead of the copies (a slot table in shared memory), so
// their latency hides behind a tile of math.
//
// Semantics the kernel guarantees:
//   - a query row with no allowed key (and no sink) is written as zeros;
//   - a key whose page lies outside [0, num_blocks) or beyond max_blocks_per_seq reads as zeros (the
//     host rejects such batches where it can; the kernel only guarantees it never reads outside the pool);
//   - every element of the chunk's rows in this head's output columns is written, nothing else, provided
//     params.max_query_len bounds every chunk length (grid.x is sized from it on the host).
//
// fp8 KV cache (kKvFp8): K/V rows are 1-byte e4m3fn codes, half the bytes of bf16. They travel global ->
// shared with 8-byte cp.async into byte staging tiles (same thread-to-chunk layout as bf16, 8 codes a chunk
// instead of 8 bf16), and each thread widens the chunks it copied into one bf16 K/V tile (exact) before
// the barrier that precedes the math, so the mma path is the bf16 one. The scales never touch the tiles:
// k_scale joins the score multiplier and v_scale the final normalization, both in fp32.
#pragma once

#include "attnplan/attention_params.h"
#include "attnplan/common.cuh"
#include "attnplan/fp8_kv.cuh"

namespace attnplan::kernels {

__host__ __device__ constexpr int attention_round_up(int value, int multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

template <int kHeadDim, int kValueHeadDim, int kGroupSize, int kBlockSize, int kBlockM, int kBlockN,
          int kMinBlocksPerSm, bool kHasSoftcap, bool kHasWindow, bool kHasSpans, bool kHasSinks,
          bool kKvFp8 = false>  // defaulted: a bf16 cache (and stubs written before fp8) need not name it
struct AttentionTraits {
  using Params = AttentionParams;
  static constexpr int head_dim = kHeadDim;
  static constexpr int value_head_dim = kValueHeadDim;
  static constexpr int group_size = kGroupSize;  // query heads per kv head
  static constexpr int block_size = kBlockSize;  // tokens per cache page
  static constexpr int block_m = kBlockM;        // query rows per CTA
  static constexpr int block_n = kBlockN;        // keys per tile
  // CTAs per SM the register allocation must allow (__launch_bounds__): 2 caps 8-warp CTAs at 128
  // registers per thread; 1 lets ptxas use up to 255 (and hoist more loads).
  static constexpr int min_blocks_per_sm = kMinBlocksPerSm;
  static constexpr bool has_softcap = kHasSoftcap;
  static constexpr bool has_window = kHasWindow;
  static constexpr bool has_spans = kHasSpans;
  static constexpr bool has_sinks = kHasSinks;
  static constexpr bool kv_fp8 = kKvFp8;  // cache of 1-byte e4m3fn codes (see the top of the file)

  static constexpr int warps = kBlockM / 16;  // 16 query rows per warp: one mma row block
  static constexpr int threads = warps * 32;
  static constexpr int stages = 2;  // K/V tiles in flight: the one computed and the one loading
  // bf16 K/V tiles in shared memory: one per stage, or with fp8 one only (the stages are byte staging).
  static constexpr int tile_stages = kKvFp8 ? 1 : stages;

  // mma k-steps are 16 wide: a head dim that is an odd multiple of 8 gets one zero chunk in shared memory.
  static constexpr int head_dim_padded = attention_round_up(kHeadDim, 16);
  static constexpr int value_dim_padded = attention_round_up(kValueHeadDim, 16);
  // Shared row strides in elements. The extra 16 bytes make a row an odd number of 16-byte units, so the
  // 8 rows one ldmatrix phase reads at the same column land in 8 different bank groups.
  static constexpr int qk_row_stride = head_dim_padded + 8;
  static constexpr int v_row_stride = value_dim_padded + 8;
  static constexpr int key_chunks = kHeadDim / 8;  // 16-byte chunks in one cache row
  static constexpr int value_chunks = kValueHeadDim / 8;

  // Shared memory, in bf16 elements: Q [block_m, qk_row_stride], then per tile stage K [block_n,
  // qk_row_stride] and V [block_n, v_row_stride]. The output tile [block_m, v_row_stride] reuses it after
  // the loop.
  static constexpr int q_elements = kBlockM * qk_row_stride;
  static constexpr int k_elements = kBlockN * qk_row_stride;
  static constexpr int v_elements = kBlockN * v_row_stride;
  static constexpr int main_elements = q_elements + tile_stages * (k_elements + v_elements);
  static constexpr int output_elements = kBlockM * v_row_stride;
  // Ahead of all that, the cache slot of every key row of each stage's tile: int [stages][block_n].
  static constexpr int slot_table_bytes = stages * kBlockN * 4;
  // fp8 only, after the bf16 region: per stage K codes [block_n, head_dim] then V codes [block_n,
  // value_head_dim], bytes, rows unpadded (8-byte chunks; head dims are multiples of 8).
  static constexpr int staging_k_bytes = kBlockN * kHeadDim;
  static constexpr int staging_v_bytes = kBlockN * kValueHeadDim;
  static constexpr int staging_bytes = kKvFp8 ? stages * (staging_k_bytes + staging_v_bytes) : 0;
  static constexpr int bf16_region_bytes =
      2 * (main_elements > output_elements ? main_elements : output_elements);
  static constexpr int shared_bytes = slot_table_bytes + bf16_region_bytes + staging_bytes;

  static_assert(kHeadDim % 8 == 0 && kHeadDim >= 16 && kHeadDim <= 256,
                "head_dim: a multiple of 8 in [16, 256]");
  static_assert(kValueHeadDim % 8 == 0 && kValueHeadDim >= 16 && kValueHeadDim <= 256,
                "value_head_dim: a multiple of 8 in [16, 256]");
  static_assert(kGroupSize >= 1, "group_size must be positive");
  static_assert(kBlockSize >= 1 && (kBlockSize & (kBlockSize - 1)) == 0, "block_size must be a power of two");
  static_assert(kBlockM == 64 || kBlockM == 128, "block_m: 64 or 128 rows (4 or 8 warps)");
  static_assert(kBlockN == 16 || kBlockN == 32 || kBlockN == 64, "block_n: 16, 32 or 64 keys");
  static_assert(kMinBlocksPerSm >= 1 && kMinBlocksPerSm <= 4, "min_blocks_per_sm: 1 to 4");
  static_assert((qk_row_stride / 8) % 2 == 1 && (v_row_stride / 8) % 2 == 1,
                "shared rows must be an odd number of 16-byte units (conflict-free ldmatrix)");
};

namespace attention_detail {

// ---- PTX wrappers (sm_80+) -------------------------------------------------------------------------

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, bypassing L1. `source_bytes` 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(unsigned destination, const void* source, int source_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(source),
               "r"(source_bytes));
}
// 8 bytes global -> shared (through L1: .cg takes 16 bytes only); `source_bytes` 0 writes zeros.
__device__ __forceinline__ void cp_async_8(unsigned destination, const void* source, int source_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(destination), "l"(source),
               "r"(source_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most `kPending` committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
// Waits until every cp.async of this thread has completed, committed to a group or not: a copy handed to
// an mbarrier (cp.async.mbarrier.arrive) and never committed is outside what wait_group counts.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::);
}

// Four 8x8 bf16 matrices; lane l supplies the row address of matrix l / 8, row l % 8. Register i holds
// matrix i's fragment: row lane / 4, columns 2 * (lane % 4) + {0, 1} (transposed with .trans).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&fragment)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&fragment)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(address));
}

// accumulator[16x8] += a[16x16] * b[16x8], bf16 operands, fp32 accumulation. Fragments (g = lane / 4,
// t = lane % 4): a {row g, row g + 8} x {cols 2t.., cols 2t + 8..}; b {k 2t.., k 2t + 8..} at column g;
// accumulator {row g: cols 2t, 2t + 1; row g + 8: cols 2t, 2t + 1}.
__device__ __forceinline__ void mma_bf16_16816(float (&accumulator)[4], const unsigned (&a)[4], unsigned b0,
                                               unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));  // exp2(-inf) = +0
  return y;
}

// 2^x on the FMA pipe instead of the MUFU unit (which retires 16 ex2 per SM and clock: at D 64 that is as
// many exponentials per clock as the tensor cores consume, attention-notes.md, session 11). x rounds to
// the nearest integer j by the 1.5 * 2^23 shift, 2^(x - j) for x - j in [-1/2, 1/2] is a cubic (relative
// error below 7.5e-5: far below the bf16 rounding of the probabilities it feeds), and j goes into the
// exponent bits with an integer add. Below 2^-126 it returns 0, as ex2.approx.ftz flushes: masked scores
// (-inf) give exact zeros. About ten FMA- and ALU-pipe instructions against one MUFU op.
__device__ __forceinline__ float polynomial_exp2(float x) {
  const bool underflow = x < -126.0f;
  x = fmaxf(x, -126.0f);
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: x + kShift holds round(x) in its low mantissa bits
  const float shifted = x + kShift;
  const float fraction = x - (shifted - kShift);
  float power =
      fmaf(fmaf(fmaf(0.0551716685f, fraction, 0.242611155f), fraction, 0.693260968f), fraction, 0.999928057f);
  power = __int_as_float(__float_as_int(power) + (__float_as_int(shifted) << 23));
  return underflow ? 0.0f : power;
}

// tanh to about 2^-11 relative (one MUFU op): far below the bf16 rounding of the q and k the score comes
// from.
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// A 4 x 4 transpose of 32-bit words within each quad (lanes 4 g .. 4 g + 3; lane_in_quad = lane % 4): word j
// of lane i becomes word i of lane j. Every lane of the warp must call it. An accumulator row's bf16 pairs
// for columns 8 c + 2 i, + 1 (lane i, n8 tiles c = 4 k .. 4 k + 3) become the 16 contiguous bytes of tile
// 4 k + i in lane i, so the row is stored 16 bytes a lane rather than 4. Two exchanges (lanes i ^ 1, then
// i ^ 2) of two words each; the selects keep the words in registers (a runtime index would put them in
// local memory).
__device__ __forceinline__ void quad_transpose(unsigned (&words)[4], int lane_in_quad) {
  const bool odd = lane_in_quad & 1;
#pragma unroll
  for (int m = 0; m < 4; m += 2) {  // after: words[m + s] came from lane (lane_in_quad & ~1) | s
    const unsigned keep = odd ? words[m + 1] : words[m];
    const unsigned received = __shfl_xor_sync(0xffffffffu, odd ? words[m] : words[m + 1], 1);
    words[m] = odd ? received : keep;
    words[m + 1] = odd ? keep : received;
  }
  const bool high = lane_in_quad & 2;
#pragma unroll
  for (int s = 0; s < 2; ++s) {  // after: words[2 h + s] came from lane 2 h + s
    const unsigned keep = high ? words[2 + s] : words[s];
    const unsigned received = __shfl_xor_sync(0xffffffffu, high ? words[s] : words[2 + s], 2);
    words[s] = high ? received : keep;
    words[2 + s] = high ? keep : received;
  }
}

// One 16-byte global store (address 16-byte aligned). Written out because NVRTC split some uint4 stores of
// the attention epilogue into four 4-byte ones (the first of each row's, in the PTX of session 42).
__device__ __forceinline__ void store_global_16(void* address, const unsigned (&words)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "r"(words[0]), "r"(words[1]),
               "r"(words[2]), "r"(words[3])
               : "memory");
}

inline constexpr int kNoTile = 0x7fffffff;
// The score of a masked key (NVRTC has no <cmath> INFINITY).
__device__ __forceinline__ float minus_infinity() {
  return __int_as_float(0xff800000u);
}

// The key tiles one query tile visits, in increasing order and each once: the band the causal mask and
// the window leave ([band_begin, band_end), never empty: every row sees itself), plus the tiles of each
// bidirectional span that intersects the query tile. Same value in every thread of the CTA.
template <int kBlockN, bool kHasSpans>
struct KeyTileSchedule {
  int band_begin;
  int band_end;
  const int* spans;  // [span_count, 2]: the spans of this sequence that reach the query tile
  int span_count;

  // Span i's key tiles: [span_first_tile(i), span_end_tile(i)).
  __device__ int span_first_tile(int i) const { return spans[2 * i] / kBlockN; }
  __device__ int span_end_tile(int i) const { return (spans[2 * i + 1] + kBlockN - 1) / kBlockN; }

  // The smallest visited tile after `after` (-1 for the first), or kNoTile.
  __device__ int next(int after) const {
    const int candidate = after + 1;
    int best = candidate < band_end ? max(candidate, band_begin) : kNoTile;
    if constexpr (kHasSpans) {
      for (int i = 0; i < span_count; ++i)
        if (candidate < span_end_tile(i)) best = min(best, max(candidate, span_first_tile(i)));
    }
    return best;
  }

  // How many tiles next() visits: the union of the band and the spans' tile ranges, in one pass over the
  // spans (sorted and disjoint, so their ranges come in order of first tile; neighbours may share a tile).
  // The walk through next() it replaces cost the sm_90a kernel a tenth of its bidirectional time.
  __device__ int count() const {
    int total = 0, reach = 0;  // tiles before `reach` are counted (or were never visited)
    auto add = [&](int first, int end) {
      first = max(first, reach);
      if (first < end) {
        total += end - first;
        reach = end;
      }
    };
    bool band_added = false;
    if constexpr (kHasSpans) {
      for (int i = 0; i < span_count; ++i) {
        if (!band_added && band_begin <= span_first_tile(i)) {
          add(band_begin, band_end);
          band_added = true;
        }
        add(span_first_tile(i), span_end_tile(i));
      }
    }
    if (!band_added) add(band_begin, band_end);
    return total;
  }

  // The end of a run of visited tiles that holds `tile` (a visited tile, or kNoTile): every tile in
  // [tile, run_end(tile)) is visited, so a walker steps by one until there and calls next() only at a gap.
  __device__ int run_end(int tile) const {
    if (tile == kNoTile) return kNoTile;
    int end = band_begin <= tile && tile < band_end ? band_end : tile + 1;
    if constexpr (kHasSpans) {
      for (int i = 0; i < span_count; ++i)
        if (span_first_tile(i) <= tile && tile < span_end_tile(i)) end = max(end, span_end_tile(i));
    }
    return end;
  }

  // Attaches the spans of sequence `seq` that meet the query positions [q_first, q_last] (sorted and
  // disjoint, so a contiguous run of the sequence's CSR list). Only with kHasSpans: params has spans then.
  __device__ void attach_spans(const AttentionParams& params, int seq, int q_first, int q_last) {
    const int span_begin = params.span_offsets[seq];
    const int span_end = params.span_offsets[seq + 1];
    int reach_first = span_end, reach_last = span_end;  // spans [reach_first, reach_last) meet the tile
    for (int i = span_begin; i < span_end; ++i) {
      if (params.span_bounds[2 * i] <= q_last && params.span_bounds[2 * i + 1] > q_first) {
        if (reach_first == span_end) reach_first = i;
        reach_last = i + 1;
      }
    }
    spans = params.span_bounds + 2 * reach_first;
    span_count = reach_last - reach_first;
  }

  // The keys a query at `position` (inside the query tile) sees through its span, as the closed range
  // [first, last]; first > last when it is in none. A row of the tile can only be in an attached span.
  __device__ void row_span(int position, int kv_len, int& first, int& last) const {
    first = 0;
    last = -1;
    for (int i = 0; i < span_count; ++i) {
      if (spans[2 * i] <= position && position < spans[2 * i + 1]) {
        first = spans[2 * i];
        last = min(spans[2 * i + 1], kv_len) - 1;
      }
    }
  }
};

__host__ __device__ constexpr int next_power_of_two(int value) {
  int power = 1;
  while (power < value) power *= 2;
  return power;
}

// How a CTA's threads cover a tile of kRows rows x kChunks 16-byte chunks: `lanes` (the power of two
// >= kChunks) consecutive threads per row, one chunk each (lanes past kChunks idle), rows_per_pass rows per
// pass. A thread's chunk and first row never change, so its addresses in successive passes differ by
// compile-time constants and no per-item address has to live in a register across the main loop.
template <int kThreads, int kRows, int kChunks>
struct RowCopyLayout {
  static constexpr int lanes = next_power_of_two(kChunks);
  static constexpr int rows_per_pass = kThreads / lanes;
  static constexpr int passes = (kRows + rows_per_pass - 1) / rows_per_pass;
  static_assert(kChunks >= 1 && lanes <= kThreads, "a row must fit in one pass of the CTA");

  __device__ static int chunk() { return threadIdx.x % lanes; }
  __device__ static int first_row() { return threadIdx.x / lanes; }
  __device__ static bool idle() { return lanes != kChunks && chunk() >= kChunks; }
  __device__ static bool past_end(int row) { return kRows % rows_per_pass != 0 && row >= kRows; }
};

// The cache slot of key `position` of a sequence (spec section 5), or -1 when the position is past the
// sequence's keys or its page lies outside the block table or the pool (such rows load as zeros).
template <int kBlockSize>
__device__ __forceinline__ int cache_slot(const int* block_table, int position, int kv_len,
                                          const AttentionParams& params) {
  if (position >= kv_len) return -1;
  const int logical = position / kBlockSize;
  if (logical >= params.max_blocks_per_seq) return -1;
  const int page = __ldg(block_table + logical);
  if (page < 0 || page >= params.num_blocks) return -1;
  return page * kBlockSize + position % kBlockSize;
}

// Copies one tile of cache rows ([block_n, dim] of one kv head) into shared memory, row r from slot
// slots[r] (-1: zero-filled instead of read).
template <class Traits, int kChunks, int kSharedStride>
__device__ __forceinline__ void load_cache_tile(bf16_bits* tile_smem, const bf16_bits* cache,
                                                const int* slots, int kv_head, int kv_heads) {
  constexpr int kDim = kChunks * 8;
  using Layout = RowCopyLayout<Traits::threads, Traits::block_n, kChunks>;
  if (Layout::idle()) return;
  // cache: [num_blocks * block_size slots, kv_heads, dim]; this thread's column of its rows
  const long long slot_elements = static_cast<long long>(kv_heads) * kDim;
  const bf16_bits* column = cache + kv_head * kDim + Layout::chunk() * 8;
  const unsigned destination =
      shared_address(tile_smem + Layout::first_row() * kSharedStride + Layout::chunk() * 8);
#pragma unroll
  for (int pass = 0; pass < Layout::passes; ++pass) {
    const int row = Layout::first_row() + pass * Layout::rows_per_pass;
    if (Layout::past_end(row)) break;
    const int slot = slots[row];
    cp_async_16(destination + pass * Layout::rows_per_pass * kSharedStride * 2,
                slot >= 0 ? column + slot * slot_elements : cache, slot >= 0 ? 16 : 0);
  }
}

// fp8 cache: the same tile as 1-byte codes into byte staging [block_n, dim] (row stride dim bytes), 8
// codes (8 bytes) per thread chunk, with the thread-to-chunk layout of load_cache_tile.
template <class Traits, int kChunks>
__device__ __forceinline__ void load_cache_tile_fp8(unsigned char* staging, const unsigned char* cache,
                                                    const int* slots, int kv_head, int kv_heads) {
  constexpr int kDim = kChunks * 8;
  using Layout = RowCopyLayout<Traits::threads, Traits::block_n, kChunks>;
  if (Layout::idle()) return;
  // cache: [num_blocks * block_size slots, kv_heads, dim] bytes; this thread's column of its rows
  const long long slot_bytes = static_cast<long long>(kv_heads) * kDim;
  const unsigned char* column = cache + kv_head * kDim + Layout::chunk() * 8;
  const unsigned destination = shared_address(staging + Layout::first_row() * kDim + Layout::chunk() * 8);
#pragma unroll
  for (int pass = 0; pass < Layout::passes; ++pass) {
    const int row = Layout::first_row() + pass * Layout::rows_per_pass;
    if (Layout::past_end(row)) break;
    const int slot = slots[row];
    cp_async_8(destination + pass * Layout::rows_per_pass * kDim,
               slot >= 0 ? column + slot * slot_bytes : cache, slot >= 0 ? 8 : 0);
  }
}

// Widens the chunks this thread copied with load_cache_tile_fp8 (complete once its cp.async group is
// waited for: no barrier needed before) into the bf16 tile [block_n, kSharedStride]. Exact.
template <class Traits, int kChunks, int kSharedStride>
__device__ __forceinline__ void widen_cache_tile(bf16_bits* tile_smem, const unsigned char* staging) {
  constexpr int kDim = kChunks * 8;
  using Layout = RowCopyLayout<Traits::threads, Traits::block_n, kChunks>;
  if (Layout::idle()) return;
#pragma unroll
  for (int pass = 0; pass < Layout::passes; ++pass) {
    const int row = Layout::first_row() + pass * Layout::rows_per_pass;
    if (Layout::past_end(row)) break;
    const uint2 codes = *reinterpret_cast<const uint2*>(staging + row * kDim + Layout::chunk() * 8);
    *reinterpret_cast<uint4*>(tile_smem + row * kSharedStride + Layout::chunk() * 8) = fp8x8_to_bf16x8(codes);
  }
}

}  // namespace attention_detail

// grid: [ceil(max_query_len / block_m), num_seqs, query_heads], block: [Traits::threads],
// dynamic shared memory: Traits::shared_bytes (above 48 KiB: the function attribute must allow it).
template <class Traits>
__global__ void __launch_bounds__(Traits::threads, Traits::min_blocks_per_sm)
    attention_kernel(const AttentionParams params) {
  using namespace attention_detail;
  constexpr int kBlockM = Traits::block_m;
  constexpr int kBlockN = Traits::block_n;
  constexpr int kHeadDim = Traits::head_dim;
  constexpr int kValueDim = Traits::value_head_dim;
  constexpr int kKSteps = Traits::head_dim_padded / 16;       // mma k-steps of S = Q K^T
  constexpr int kScoreTiles = kBlockN / 8;                    // n8 tiles of S per warp
  constexpr int kOutputTiles = Traits::value_dim_padded / 8;  // n8 tiles of O per warp
  constexpr int kQkStride = Traits::qk_row_stride;
  constexpr int kVStride = Traits::v_row_stride;
  constexpr float kLog2e = 1.4426950408889634f;

  // Heavier (later, under a causal mask) query tiles first, so the longest CTAs do not start last.
  const int q_tile = gridDim.x - 1 - blockIdx.x;
  const int seq = blockIdx.y;
  const int head = blockIdx.z;
  const int kv_head = head / Traits::group_size;
  const int query_start = params.query_starts[seq];
  const int query_len = params.query_starts[seq + 1] - query_start;
  const int row_begin = q_tile * kBlockM;  // first chunk row of this tile
  if (row_begin >= query_len) return;      // grid.x covers max_query_len; this sequence is shorter
  const int rows = min(kBlockM, query_len - row_begin);
  const int context_len = params.context_lens[seq];
  const int kv_len = context_len + query_len;   // keys visible to the chunk: positions [0, kv_len)
  const int q_first = context_len + row_begin;  // positions of the tile's first and last real rows
  const int q_last = q_first + rows - 1;
  const int* block_table = params.block_tables + static_cast<long long>(seq) * params.max_blocks_per_seq;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;     // accumulator rows group and group + 8 of the warp's 16
  const int in_group = lane % 4;  // accumulator columns 2 * in_group + {0, 1} of each n8 tile

  // ---- which key tiles to visit -------------------------------------------------------------------
  KeyTileSchedule<kBlockN, Traits::has_spans> schedule;
  schedule.band_begin = 0;
  if constexpr (Traits::has_window) schedule.band_begin = max(0, q_first - params.window + 1) / kBlockN;
  schedule.band_end = q_last / kBlockN + 1;
  schedule.spans = nullptr;
  schedule.span_count = 0;
  // The keys this thread's two rows (warp * 16 + group + 8 * half) may see, as closed position ranges:
  // the band causality, the window and the sequence's end leave, and the row's span (empty: first > last).
  int row_band_first[2], row_band_last[2];
  int row_span_first[2] = {0, 0};
  int row_span_last[2] = {-1, -1};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int position = q_first + warp * 16 + group + 8 * half;
    row_band_last[half] = min(position, kv_len - 1);
    row_band_first[half] = Traits::has_window ? position - params.window + 1 : 0;
  }
  if constexpr (Traits::has_spans) {
    schedule.attach_spans(params, seq, q_first, q_last);
#pragma unroll
    for (int half = 0; half < 2; ++half)
      schedule.row_span(q_first + warp * 16 + group + 8 * half, kv_len, row_span_first[half],
                        row_span_last[half]);
  }

  // ---- shared memory ------------------------------------------------------------------------------
  extern __shared__ uint4 shared_storage[];  // uint4: 16-byte aligned for cp.async and ldmatrix
  int* slot_table = reinterpret_cast<int*>(shared_storage);  // [stages][block_n]
  bf16_bits* q_smem = reinterpret_cast<bf16_bits*>(shared_storage) +
                      Traits::slot_table_bytes / 2;  // [block_m, qk_row_stride]
  bf16_bits* k_smem = q_smem + Traits::q_elements;   // [stages][block_n, qk_row_stride]
  bf16_bits* v_smem =
      k_smem + Traits::tile_stages * Traits::k_elements;  // [tile_stages][block_n, v_row_stride]
  // fp8 only: [stages] x (K codes [block_n, head_dim], V codes [block_n, value_head_dim])
  unsigned char* staging =
      reinterpret_cast<unsigned char*>(shared_storage) + Traits::slot_table_bytes + Traits::bf16_region_bytes;

  // Odd multiples of 8: the padding chunk (columns dim .. dim + 8) must hold zeros so the last k-step of
  // S (and the extra output columns of P V, never stored) see finite values. cp.async never writes it.
  if constexpr (Traits::head_dim_padded != kHeadDim) {
    constexpr int kRows = kBlockM + Traits::tile_stages * kBlockN;  // Q rows then every stage's K rows
    for (int row = threadIdx.x; row < kRows; row += Traits::threads)
      *reinterpret_cast<uint4*>(q_smem + row * kQkStride + kHeadDim) = make_uint4(0, 0, 0, 0);
  }
  if constexpr (Traits::value_dim_padded != kValueDim) {
    for (int row = threadIdx.x; row < Traits::tile_stages * kBlockN; row += Traits::threads)
      *reinterpret_cast<uint4*>(v_smem + row * kVStride + kValueDim) = make_uint4(0, 0, 0, 0);
  }

  // Q tile: query [num_tokens, query_heads, head_dim], rows query_row_stride apart; rows past the chunk zero.
  {
    using Layout = RowCopyLayout<Traits::threads, kBlockM, Traits::key_chunks>;
    const bf16_bits* column = params.query + head * kHeadDim + Layout::chunk() * 8;
    const unsigned destination =
        shared_address(q_smem + Layout::first_row() * kQkStride + Layout::chunk() * 8);
#pragma unroll
    for (int pass = 0; pass < Layout::passes && !Layout::idle(); ++pass) {
      const int row = Layout::first_row() + pass * Layout::rows_per_pass;
      if (Layout::past_end(row)) break;
      const bool valid = row < rows;
      const long long token = query_start + row_begin + row;
      cp_async_16(destination + pass * Layout::rows_per_pass * kQkStride * 2,
                  valid ? column + token * params.query_row_stride : params.query, valid ? 16 : 0);
    }
  }

  // K/V tiles go through the slot table: a thread per key row looks its slot up one iteration early (the
  // block-table read's latency hides behind a tile of math) and leaves it in the table for the copy.
  auto load_tile = [&](int stage) {
    const int* slots = slot_table + stage * kBlockN;
    if constexpr (Traits::kv_fp8) {
      unsigned char* stage_staging = staging + stage * (Traits::staging_k_bytes + Traits::staging_v_bytes);
      load_cache_tile_fp8<Traits, Traits::key_chunks>(
          stage_staging, reinterpret_cast<const unsigned char*>(params.key_cache), slots, kv_head,
          params.kv_heads);
      load_cache_tile_fp8<Traits, Traits::value_chunks>(
          stage_staging + Traits::staging_k_bytes, reinterpret_cast<const unsigned char*>(params.value_cache),
          slots, kv_head, params.kv_heads);
    } else {
      load_cache_tile<Traits, Traits::key_chunks, kQkStride>(
          k_smem + stage * Traits::k_elements, params.key_cache, slots, kv_head, params.kv_heads);
      load_cache_tile<Traits, Traits::value_chunks, kVStride>(
          v_smem + stage * Traits::v_elements, params.value_cache, slots, kv_head, params.kv_heads);
    }
  };
  auto slot_of_row = [&](int key_tile) {  // threads < block_n: the slot of row threadIdx.x of `key_tile`
    return key_tile == kNoTile ? -1
                               : cache_slot<Traits::block_size>(block_table, key_tile * kBlockN + threadIdx.x,
                                                                kv_len, params);
  };

  int tile = schedule.next(-1);
  int next_tile = schedule.next(tile);
  if (threadIdx.x < kBlockN) {
    slot_table[threadIdx.x] = slot_of_row(tile);
    slot_table[kBlockN + threadIdx.x] = slot_of_row(next_tile);
  }
  __syncthreads();
  load_tile(0);
  cp_async_commit();  // group: Q and the first K/V tile

  // ---- online softmax state (log2 domain) ---------------------------------------------------------
  // Scores are kept as score * log2(e) so exp2 does the exponentials. A sink joins the denominator only:
  // it starts the running max at S * log2(e) and the running sum at exp2(0) = 1 (in one thread of the
  // quad, because the partial sums of the four are added at the end), with no value row.
  float row_max[2] = {minus_infinity(), minus_infinity()};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's partial sum over its columns
  if constexpr (Traits::has_sinks) {
    const float sink = params.sinks[head] * kLog2e;
    row_max[0] = row_max[1] = sink;
    row_sum[0] = row_sum[1] = in_group == 0 ? 1.0f : 0.0f;
  }
  float output[kOutputTiles][4];  // O [16 rows of this warp, value_dim_padded], accumulator fragments
#pragma unroll
  for (int j = 0; j < kOutputTiles; ++j) output[j][0] = output[j][1] = output[j][2] = output[j][3] = 0.0f;

  // fp8: q . k is computed against the codes, so k_scale multiplies the score scale (exact in the math,
  // one fp32 rounding here).
  const float score_scale = Traits::kv_fp8 ? params.scale * params.k_scale : params.scale;
  float score_multiplier = score_scale * kLog2e;  // no softcap: x = scale * q.k * log2(e)
  float softcap_multiplier = 0.0f;                // softcap: x = c * log2(e) * tanh(scale / c * q.k)
  if constexpr (Traits::has_softcap) {
    score_multiplier = score_scale / params.softcap;
    softcap_multiplier = params.softcap * kLog2e;
  }

  // Per-lane ldmatrix row offsets (elements) inside a warp's operand tiles, see ldmatrix_x4.
  const int q_lane_offset = (warp * 16 + (lane % 16)) * kQkStride + (lane / 16) * 8;  // A: 16x16
  const int k_lane_offset =
      ((lane % 8) + (lane / 16) * 8) * kQkStride + ((lane / 8) % 2) * 8;  // B: 2 n8 x k16
  const int v_lane_offset = (lane % 16) * kVStride + (lane / 16) * 8;     // B^T: k16 x 2 n8
  const unsigned q_base = shared_address(q_smem + q_lane_offset);

  int stage = 0;
  while (tile != kNoTile) {
    // Invariant: the slot table of stage ^ 1 holds next_tile's slots. Look up the tile after it now.
    const int tile_after_next = next_tile == kNoTile ? kNoTile : schedule.next(next_tile);
    const int slot_after_next = threadIdx.x < kBlockN ? slot_of_row(tile_after_next) : -1;
    if (next_tile != kNoTile) load_tile(stage ^ 1);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning "this tile"
    cp_async_wait<1>();
    if constexpr (Traits::kv_fp8) {  // this thread's chunks of this tile's codes have landed: widen them
      const unsigned char* stage_staging =
          staging + stage * (Traits::staging_k_bytes + Traits::staging_v_bytes);
      widen_cache_tile<Traits, Traits::key_chunks, kQkStride>(k_smem, stage_staging);
      widen_cache_tile<Traits, Traits::value_chunks, kVStride>(v_smem,
                                                               stage_staging + Traits::staging_k_bytes);
    }
    __syncthreads();
    const int tile_stage = Traits::kv_fp8 ? 0 : stage;  // the bf16 tile the math reads

    // S = Q K^T for the warp's 16 rows x block_n keys.
    float score[kScoreTiles][4];
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n) score[n][0] = score[n][1] = score[n][2] = score[n][3] = 0.0f;
    const unsigned k_base = shared_address(k_smem + tile_stage * Traits::k_elements + k_lane_offset);
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) {
      unsigned a[4];
      ldmatrix_x4(a, q_base + k * 16 * 2);
#pragma unroll
      for (int n = 0; n < kScoreTiles; n += 2) {
        unsigned b[4];
        ldmatrix_x4(b, k_base + (n * 8 * kQkStride + k * 16) * 2);
        mma_bf16_16816(score[n], a, b[0], b[1]);
        mma_bf16_16816(score[n + 1], a, b[2], b[3]);
      }
    }

    // Scale (and softcap), then mask. A tile wholly below the diagonal of every row, above every row's
    // window edge and inside the keys needs no mask.
    const int key_first = tile * kBlockN;
    bool needs_mask = key_first + kBlockN - 1 > q_first || key_first + kBlockN > kv_len;
    if constexpr (Traits::has_window) needs_mask = needs_mask || key_first <= q_last - params.window;
    // The rows' visible key ranges relative to this thread's first column, so each element compares with
    // compile-time offsets.
    int visible_first[2], visible_last[2], span_first[2], span_last[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int column = key_first + 2 * in_group;
      visible_first[half] = row_band_first[half] - column;
      visible_last[half] = row_band_last[half] - column;
      span_first[half] = row_span_first[half] - column;
      span_last[half] = row_span_last[half] - column;
    }
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = score[n][e];
        if constexpr (Traits::has_softcap) {
          x = softcap_multiplier * fast_tanh(x * score_multiplier);
        } else {
          x *= score_multiplier;
        }
        if (needs_mask) {
          const int half = e / 2;
          const int key = n * 8 + (e % 2);  // relative to key_first + 2 * in_group
          bool allowed = visible_first[half] <= key && key <= visible_last[half];
          if constexpr (Traits::has_spans)
            allowed = allowed || (span_first[half] <= key && key <= span_last[half]);
          if (!allowed) x = minus_infinity();
        }
        score[n][e] = x;
      }
    }

    // Online softmax: new running max per row, rescale what was accumulated, exponentiate.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = minus_infinity();
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n)
        tile_max = fmaxf(tile_max, fmaxf(score[n][2 * half], score[n][2 * half + 1]));
      const float new_max = fmaxf(row_max[half], quad_max(tile_max));
      // Nothing allowed yet in this row: subtract 0 so that exp2(-inf - base) stays 0 rather than NaN.
      const float base = new_max == minus_infinity() ? 0.0f : new_max;
      const float correction = fast_exp2(row_max[half] - base);
      row_max[half] = new_max;
      float partial = 0.0f;
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n) {
        score[n][2 * half] = fast_exp2(score[n][2 * half] - base);
        score[n][2 * half + 1] = fast_exp2(score[n][2 * half + 1] - base);
        partial += score[n][2 * half] + score[n][2 * half + 1];
      }
      row_sum[half] = row_sum[half] * correction + partial;
#pragma unroll
      for (int j = 0; j < kOutputTiles; ++j) {
        output[j][2 * half] *= correction;
        output[j][2 * half + 1] *= correction;
      }
    }

    // O += P V. The S accumulators of n8 tiles 2k and 2k + 1 are exactly the A fragment of k-step k.
    const unsigned v_base = shared_address(v_smem + tile_stage * Traits::v_elements + v_lane_offset);
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k) {
      const unsigned a[4] = {pack_bf16(score[2 * k][0], score[2 * k][1]),
                             pack_bf16(score[2 * k][2], score[2 * k][3]),
                             pack_bf16(score[2 * k + 1][0], score[2 * k + 1][1]),
                             pack_bf16(score[2 * k + 1][2], score[2 * k + 1][3])};
#pragma unroll
      for (int j = 0; j < kOutputTiles; j += 2) {
        unsigned b[4];
        ldmatrix_x4_trans(b, v_base + (k * 16 * kVStride + j * 8) * 2);
        mma_bf16_16816(output[j], a, b[0], b[1]);
        mma_bf16_16816(output[j + 1], a, b[2], b[3]);
      }
    }

    // This stage's tile is consumed and its copies completed: its table now takes the tile after next.
    if (threadIdx.x < kBlockN) slot_table[stage * kBlockN + threadIdx.x] = slot_after_next;
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
    stage ^= 1;
    tile = next_tile;
    next_tile = tile_after_next;
  }
  cp_async_wait<0>();  // nothing is in flight (the last group was empty); the stages become the output tile

  // ---- epilogue: normalize, stage the bf16 tile in shared memory, store 16-byte rows ---------------
  bf16_bits* out_smem = q_smem;  // [block_m, v_row_stride], aliases Q and the stages (all reads done)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float total = quad_sum(row_sum[half]);
    // fp8: P V was computed against the codes; v_scale restores the values (no allowed key and no sink:
    // zeros either way).
    const float inverse = total > 0.0f ? (Traits::kv_fp8 ? params.v_scale : 1.0f) / total : 0.0f;
    const int row = warp * 16 + group + 8 * half;
#pragma unroll
    for (int j = 0; j < kOutputTiles; ++j) {
      *reinterpret_cast<unsigned*>(out_smem + row * kVStride + j * 8 + 2 * in_group) =
          pack_bf16(output[j][2 * half] * inverse, output[j][2 * half + 1] * inverse);
    }
  }
  __syncthreads();
  // output: [num_tokens, query_heads * value_head_dim], rows output_row_stride apart
  {
    using Layout = RowCopyLayout<Traits::threads, kBlockM, Traits::value_chunks>;
    bf16_bits* column = params.output + head * kValueDim + Layout::chunk() * 8;
#pragma unroll
    for (int pass = 0; pass < Layout::passes && !Layout::idle(); ++pass) {
      const int row = Layout::first_row() + pass * Layout::rows_per_pass;
      if (Layout::past_end(row) || row >= rows) break;
      const long long token = query_start + row_begin + row;
      *reinterpret_cast<uint4*>(column + token * params.output_row_stride) =
          *reinterpret_cast<const uint4*>(out_smem + row * kVStride + Layout::chunk() * 8);
    }
  }
}

}  // namespace attnplan::kernels
