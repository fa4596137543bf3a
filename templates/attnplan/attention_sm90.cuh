// Variable-length paged attention for prefill on sm_90a (spec section 6), FlashAttention-3 style: the same
// AttentionParams and semantics as attention.cuh for head_dim == value_head_dim in {64, 128, 256}, causal
// with an optional sliding window, bidirectional spans, attention sinks, a logit softcap and an fp8 cache,
// GQA/MQA, any power-of-two page size, cached prefixes.
//
// GQA packing: one CTA owns block_m = 128 (or, D 64, 192) rows of one sequence that are (token, query
// head) pairs of heads_per_cta heads sharing a kv head (row r: token r / heads_per_cta, head r %
// heads_per_cta of the CTA's heads), so each K/V tile is loaded once for all of them; tokens_per_cta =
// block_m / heads_per_cta. It has three (or four) warpgroups:
//   - warpgroup 0, the producer, gives most of its registers away (setmaxnreg) and gathers Q once and then
//     each key tile's K and V rows through the block table with cp.async (16-byte chunks, pages of any
//     size), into 128-byte-swizzled shared memory, `stages` deep; each thread hands its copies to the
//     stage's full mbarrier (cp.async.mbarrier.arrive) instead of waiting for them, and an empty mbarrier
//     per stage says every consumer is done with it;
//   - warpgroups 1 and 2 (and 3), the consumers, own 64 query rows each: S = Q K^T with wgmma (Q and K both
//     K-major from shared memory), the online softmax in fp32 registers (exp2, scale folded in), then
//     O += P V with P from registers (bf16, the wgmma A-fragment layout) and V from shared memory as an
//     N-major B operand.
// K/V by cp.async or TMA: the cp.async gather handles every page size (block_size 1 included) with one
// code path and needs no tensor map; with kv_tma (pages of 8 or more slots, at most 32 boxes per tile) one
// producer warp instead issues a TMA box per page and 64-column block from two tensor maps the host encodes
// per launch, which frees the producer's issue slots (the gather stays for the tile that reaches past the
// keys at D <= 128; at D 256 that tile comes by TMA too and its V rows past the keys are zeroed). Q is
// read once per CTA by cp.async and is a small share of the traffic.
//
// Semantics the kernel guarantees (as attention.cuh): a key whose page lies outside [0, num_blocks) or
// beyond max_blocks_per_seq reads as zeros; every element of the chunk's rows in this head's output
// columns is written, nothing else, provided params.max_query_len bounds every chunk length.
#pragma once

#include "attnplan/attention.cuh"
#include "attnplan/attention_params.h"
#include "attnplan/wgmma.cuh"

namespace attnplan::kernels {

namespace attention_sm90_detail {

// Byte offset of bf16 element (row, column) in a tile of `rows` rows stored in the 128-byte swizzle
// layout (sm90::kmajor_descriptor / mnmajor_descriptor): 64-element column blocks one after another
// (rows * 128 bytes each); in a block, row r at r * 128 bytes, its 16-byte chunk c at chunk c ^ (r % 8).
// What a TMA box with CU_TENSOR_MAP_SWIZZLE_128B writes, here for the cp.async gather.
__host__ __device__ constexpr unsigned swizzle128_offset(int row, int column, int rows) {
  return static_cast<unsigned>((column / 64) * rows * 128 + row * 128 +
                               ((((column % 64) / 8) ^ (row % 8)) * 16) + (column % 8) * 2);
}

// Named barriers 1 to 3 (0 is __syncthreads) for the consumers' ping-pong: warpgroup w waits on barrier
// 1 + w (bar.sync: its 128 threads) until the warpgroup before it in the round arrived (bar.arrive: 128
// more), 256 in all. Barriers 6 and 7 the same way, for the stagger of two consumer warpgroups on the
// overlapped schedule (the kernel's kStaggered).
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// Named barrier 4: the producer warpgroup's 128 threads alone (the item schedule's hand-over).
__device__ __forceinline__ void producer_barrier_sync() {
  asm volatile("bar.sync 4, 128;\n" ::: "memory");
}

// Named barrier 5: every consumer thread (kThreads), at a split part's end. The first form orders the
// part's partial writes before its arrival; the second returns `flag` of any thread (bar.red.or), which
// tells the others what consumer thread 0 learned from the part counter.
template <int kThreads>
__device__ __forceinline__ void consumers_barrier_sync() {
  asm volatile("bar.sync 5, %0;\n" ::"n"(kThreads) : "memory");
}
template <int kThreads>
__device__ __forceinline__ bool consumers_barrier_or(bool flag) {
  unsigned any;
  asm volatile(
      "{\n"
      ".reg .pred flag, any;\n"
      "setp.ne.u32 flag, %1, 0;\n"
      "bar.red.or.pred any, 5, %2, flag;\n"
      "selp.u32 %0, 1, 0, any;\n"
      "}\n"
      : "=r"(any)
      : "r"(static_cast<unsigned>(flag)), "n"(kThreads)
      : "memory");
  return any != 0;
}

template <bool kCondition, class IfTrue, class IfFalse>
struct Select {
  using type = IfTrue;
};
template <class IfTrue, class IfFalse>
struct Select<false, IfTrue, IfFalse> {
  using type = IfFalse;
};

// Whether key `position` of a sequence holds a key on its prefetched `page` (a page inside the pool, a
// position before kv_len; otherwise the gathers load zeros), and its cache slot when it does.
template <int kBlockSize>
__device__ __forceinline__ bool key_slot(int page, int position, int num_blocks, int kv_len,
                                         long long& slot) {
  slot = static_cast<long long>(page) * kBlockSize + static_cast<unsigned>(position) % kBlockSize;
  return page >= 0 && page < num_blocks && position < kv_len;
}

// The common parameter block of either kernel parameter type.
__device__ __forceinline__ const AttentionParams& common_params(const AttentionParams& params) {
  return params;
}
__device__ __forceinline__ const AttentionParams& common_params(const AttentionSm90Params& params) {
  return params.common;
}

// The trace (AttentionParams::trace, attention_params.h): written by one lane of each warpgroup, with plain
// stores that nothing in the kernel waits for. The slot's address is recomputed at each record from the
// parameters and blockIdx rather than kept in registers: the producer has none to spare (ptxas spilled 32-40
// bytes with a pointer kept live through its loop).
__device__ __forceinline__ unsigned long long trace_clock() {
  unsigned long long value;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(value));
  return value;
}
__device__ __forceinline__ unsigned long long trace_global_time() {
  unsigned long long value;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(value));
  return value;
}
// Record `record` of warpgroup `role`'s slot; nothing past kAttentionTraceCtas CTAs or the slot's records.
__device__ __forceinline__ void trace_put(const AttentionParams& params, int role, int record,
                                          unsigned long long first, unsigned long long second) {
  if (static_cast<int>(blockIdx.x) < kAttentionTraceCtas && record < kAttentionTraceRecords) {
    unsigned long long* const slot =
        params.trace + attention_trace_slot_word(static_cast<int>(blockIdx.x), role);
    *reinterpret_cast<ulonglong2*>(slot + 2 * record) = make_ulonglong2(first, second);
  }
}
__device__ __forceinline__ void trace_begin(const AttentionParams& params, int role) {
  trace_put(params, role, 0, trace_clock(), trace_global_time());
}
// Event `event` of the warpgroup's `walked`-th unit (counted from 0), unit `unit`.
__device__ __forceinline__ void trace_event(const AttentionParams& params, int role, int walked, int event,
                                            int unit) {
  trace_put(params, role, attention_trace_event_record(walked, event), trace_clock(),
            static_cast<unsigned long long>(unit));
}
__device__ __forceinline__ void trace_end(const AttentionParams& params, int role, int walked) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  trace_put(params, role, 1, trace_clock(), trace_global_time());
  trace_put(params, role, 2, sm, static_cast<unsigned long long>(walked));
}

}  // namespace attention_sm90_detail

template <int kHeadDim, int kGroupSize, int kHeadsPerCta, int kBlockSize, int kBlockN, bool kHasWindow,
          bool kHasSpans = false, bool kHasSinks = false, bool kHasSoftcap = false, int kStages = 2,
          bool kOverlapSoftmax = false, bool kPingPong = false, bool kKvTma = false, bool kKvFp8 = false,
          int kConsumers = 2, bool kSplitsTail = false, bool kTraces = false>
struct AttentionSm90Traits {
  // K/V pages by TMA: the producer warps issue a box per page and 64-column block of each tile, completing
  // on the stage's full barrier, instead of 128 threads gathering 16-byte chunks with cp.async (whose
  // address arithmetic and issue slots were the producer's limit, attention-notes.md). A tile that reaches
  // past the sequence's keys keeps the gather (D <= 128) or has its V rows past kv_len zeroed (D 256, below):
  // a masked score gives P = 0, but 0 * NaN from a stale V slot is NaN; K needs no zeros, every score past
  // kv_len is replaced by -inf. Pages of at least 8 slots: whole 8-row swizzle atoms.
  static constexpr bool kv_tma = kKvTma;
  // At D 256 the TMA path is TMA only (attention_params.h, attention_sm90_kv_tma_only): no gather in the
  // producer; the tile past the keys lands on the landing barrier, its V rows past kv_len are zeroed.
  static constexpr bool kv_tma_only = attention_sm90_kv_tma_only(kHeadDim, kKvTma);
  // K and V on their own full and empty mbarriers (attention_params.h, attention_sm90_kv_split: D 256 by
  // TMA on 128-key tiles, one stage): the consumers release K once S has read it and wait for V only before
  // P V, so K(i + 1) loads under the two warpgroups' P V(i) and V(i + 1) under their S(i + 1).
  static constexpr bool kv_split = attention_sm90_kv_split(kHeadDim, kBlockN, kKvTma);
  using Params = typename attention_sm90_detail::Select<kKvTma, AttentionSm90Params, AttentionParams>::type;
  static constexpr int head_dim = kHeadDim;  // q/k and v head dims (equal on this path)
  static constexpr int group_size = kGroupSize;
  static constexpr int heads_per_cta = kHeadsPerCta;  // query heads of one kv head packed into a CTA's rows
  static constexpr int block_size = kBlockSize;
  static constexpr int block_n = kBlockN;  // keys per tile: the N of S = Q K^T, the K of O += P V
  static constexpr bool has_window = kHasWindow;
  // Bidirectional spans (params.span_offsets / span_bounds): the key tiles of each span that meets the query
  // tile join the causal band, and a row inside a span also sees the span's keys past its diagonal.
  static constexpr bool has_spans = kHasSpans;
  // Attention sinks (params.sinks, one logit per query head): each joins its rows' softmax denominator.
  static constexpr bool has_sinks = kHasSinks;
  // A logit softcap c (params.softcap, Gemma 2): x = c tanh(scale q . k / c) before the softmax.
  static constexpr bool has_softcap = kHasSoftcap;
  // An fp8 e4m3fn KV cache (fp8_kv.cuh): the producer gathers each tile's codes into one of two staging
  // buffers and, a tile later, widens them into the bf16 K/V tiles the wgmmas read (exact: every e4m3fn
  // value is a bf16); k_scale joins the score multiplier and v_scale the final normalization.
  static constexpr bool kv_fp8 = kKvFp8;
  // Consumer schedule. false: per tile S, wait, softmax, P V, wait (each warpgroup in series; the two
  // warpgroups overlap only through the warp schedulers). true: S(i) and P(i-1) V(i-1) are issued back to
  // back and softmax(i) runs while P V is in flight, so a consumer holds two stages (V of i - 1, K of i).
  static constexpr bool overlap_softmax = kOverlapSoftmax;
  // Ping-pong (FA3): the consumer warpgroups take turns issuing their wgmmas (one named barrier each, in a
  // round), so one's softmax runs while the others' matrix products occupy the tensor cores; without it
  // they drift into lockstep, all in softmax at once and all queueing wgmmas at once. The plan turns it on
  // for the serial schedule only: with overlap_softmax a warpgroup's softmax runs under its own P V, and
  // the turns cost more than they keep (choose_sm90_attention_tiling).
  static constexpr bool ping_pong = kPingPong;
  // The split tail (AttentionParams::split_items): the last round's items cut over their key tiles, each
  // part's partial merged by the last part (merge_parts below). Compiled only into the kernel a launch
  // that splits takes (the plan's attention_split): the merge's code, never run, cost the D 128 1k
  // bidirectional row 5% and the 4k rows 1% (attention-notes.md, "Session 46"). Without it the kernel
  // ignores split_items.
  static constexpr bool splits_tail = kSplitsTail;
  static_assert(!kSplitsTail || attention_sm90_splits(kHeadDim),
                "a split tail only where attention_sm90_splits allows it");
  // The trace (AttentionParams::trace): each warpgroup's events per unit, for `attnplan bench
  // --trace-attention` (docs/attention-trace.md). Never planned unless asked: it is its own specialization.
  static constexpr bool traces = kTraces;
  static_assert(1 + kConsumers <= kAttentionTraceRoles, "a trace slot per warpgroup");
  // Of every 8 n8 column tiles of S, how many take their exponentials from polynomial_exp2 on the FMA
  // pipe rather than the MUFU unit: at D 64 the MUFU's 16 ex2 per SM and clock match the tensor cores'
  // rate exactly (one per 4 D FLOPs), so the softmax waits on it (Nsight Compute: MIO throttle). Measured
  // (attention-notes.md, sessions 11, 12, 50 and 58): with two consumer warpgroups (the short-launch
  // specialization, short_launch_specialization) none: session 58 measured 0 level to 5% faster than 1,
  // and 1 2-6% faster than 2 (the kernel waits on its instructions' latency, two warps a scheduler, more
  // than on the MUFU: Nsight Compute); with three, whose softmaxes overlap each other and whose issue
  // slots are as scarce as tensor cycles, none (session 50, against session 12's 1: the causal rows 3-6%
  // faster, the bidirectional ones level to 2% faster), but in the split tail's specialization, whose
  // two one-sequence bidirectional rows ran 2.6% slower without it, 1.
  static constexpr int polynomial_exp_eighths = kHeadDim == 64 && kConsumers == 3 && kSplitsTail ? 1 : 0;
  static_assert(polynomial_exp_eighths >= 0 && polynomial_exp_eighths <= 8, "eighths: 0 to 8");
  // Lazy rescale: a row keeps its running max, and O and the row sum skip their rescale, until a tile's
  // max exceeds it by more than rescale_threshold in exp2 units; the probabilities then reach at most
  // 2^threshold (harmless in fp32 and in P's bf16) and O / l is the same quotient. Decided per warp by a
  // vote, so a warp skips its rescale as a whole, which after a row's first tiles is almost always. On the
  // overlapped schedule with two consumer warpgroups only (D 128): there it measured -2 to -4% (with the
  // rescale moved under S(i), below), while D 256's serial schedule ran 3% slower with it and three
  // consumer warpgroups (D 64, 128 registers each) spill its state (attention-notes.md, "Session 30").
  static constexpr bool lazy_rescale = kOverlapSoftmax && kConsumers == 2;
  static constexpr float rescale_threshold = 8.0f;

  // Consumer warpgroups of 64 query rows each. Three (block_m 192, D 64 only) keep two warpgroups' matrix
  // products in flight while the third runs its softmax: at D 64 a softmax outlasts one warpgroup's two
  // products (its exponentials are the MUFU unit's full rate, attention-notes.md, session 12). 512 threads
  // leave 128 registers each at launch: the consumers' schedule must then be the serial one.
  static constexpr int consumer_warpgroups = kConsumers;
  static_assert(kConsumers == 2 || kConsumers == 3, "consumers: 2 or 3 warpgroups");
  static_assert(kConsumers == 2 || (kHeadDim == 64 && !kOverlapSoftmax),
                "three consumer warpgroups: D 64 and the serial schedule only (152 registers per consumer "
                "thread; the overlapped one spills there)");
  static constexpr int block_m = 64 * consumer_warpgroups;  // a wgmma's M per consumer warpgroup
  static constexpr int tokens_per_cta = block_m / kHeadsPerCta;
  static constexpr int used_rows = tokens_per_cta * kHeadsPerCta;  // rows past it stay zero, never stored
  static constexpr int threads = 128 * (1 + consumer_warpgroups);
  static_assert(threads == attention_sm90_threads(block_m), "the host's thread count (attention_params.h)");
  static constexpr int producer_threads = 128;
  static constexpr int consumer_threads = 128 * consumer_warpgroups;
  static constexpr int stages = kStages;  // K/V tiles in flight
  // 384 threads start at 168 registers each (65536 / 384, rounded down to 8); the producer drops so the
  // consumers can hold S [64, block_n] and O [64, head_dim] fp32 tiles, within the CTA's 384 x 168:
  // 128 * 56 + 256 * 224 = 64512. With TMA K/V and no spans the producer (box issue, plus the gather of the
  // tile past the keys at D <= 128, plus the persistent item walk) spills at 56 and gets 72, its consumers
  // 216; with spans the consumers spill at 216 and keep 224 (the producer then fits 56). Three consumer
  // warpgroups: 512 x 128, split 128 * 56 + 384 * 152 = 65536 (72 / 144 with TMA and no spans).
  // kv_split (S [64, 128] beside O [64, 256]): 128 * 40 + 256 * 232, the producer's TMA-only walk in 40.
  static constexpr int producer_registers = kv_split ? 40 : kKvTma && !kHasSpans ? 72 : 56;
  static constexpr int consumer_registers = kConsumers == 3 ? (kKvTma && !kHasSpans ? 144 : 152)
                                                            : (kv_split               ? 232
                                                               : kKvTma && !kHasSpans ? 216
                                                                                      : 224);
  static constexpr int launch_registers = 65536 / threads / 8 * 8;  // what the CTA holds: 168 or 128 each
  static_assert(
      producer_threads * producer_registers + consumer_threads * consumer_registers <=
          threads * launch_registers,
      "setmaxnreg.inc only takes what setmaxnreg.dec gave back: a larger total blocks the consumers "
      "forever");

  static constexpr int chunks = kHeadDim / 8;  // 16-byte chunks per row of q, k or v
  // The Q copy: `chunks` consecutive threads per row. The K/V copies: two threads per row, each moving
  // every other chunk (a warp-wide copy then reads whole 32-byte sectors, and a thread looks up one cache
  // slot per row).
  static constexpr int rows_per_pass = producer_threads / chunks;
  static constexpr int kv_rows_per_pass = producer_threads / 2;
  static constexpr int kv_passes = kBlockN / kv_rows_per_pass;

  // Shared memory, bytes from a 1024-byte aligned base (the 128-byte swizzle is a function of address
  // bits): Q [block_m, head_dim], per stage K [block_n, head_dim] and V [block_n, head_dim], each stored as
  // head_dim / 64 column blocks of 128-byte swizzled rows; then the full and empty mbarriers of each stage
  // (kv_split: K's full, K's empty, V's full and V's empty, each [stages]),
  // per band of Q an empty mbarrier and, banded, a full one (q_bands), TMA only the landing mbarrier, and
  // the item schedule's mbarriers and slots.
  static constexpr int q_bytes = kHeadDim * block_m * 2;
  static constexpr int k_bytes = kHeadDim * kBlockN * 2;
  static constexpr int v_bytes = kHeadDim * kBlockN * 2;
  static constexpr int q_offset = 0;
  static constexpr int k_offset = q_offset + q_bytes;
  static constexpr int v_offset = k_offset + stages * k_bytes;
  static constexpr int staging_offset = v_offset + stages * v_bytes;
  static constexpr int staging_buffer_bytes = 2 * kBlockN * kHeadDim;  // K codes then V codes [block_n, D]
  static constexpr int staging_bytes = kKvFp8 ? 2 * staging_buffer_bytes : 0;
  static constexpr int barrier_offset = staging_offset + staging_bytes;
  static constexpr int alignment_slack = 1024;  // dynamic shared memory is only 16-byte aligned
  // Q's buffer in bands (attention_sm90_q_bands). Two consumer warpgroups: a band of 64 rows each, with
  // its own empty and full mbarrier, so that the producer copies warpgroup w's next Q as soon as w has
  // read its own (its last S has landed), not when both have: a warpgroup that finishes an item first
  // starts the next one without waiting for the other, which keeps them apart at item boundaries
  // (attention-notes.md, "Session 46" and "Session 47"). Three (D 64): one band, whose copies land on
  // the item's first K/V tile's full barrier.
  static constexpr int q_bands = attention_sm90_q_bands(block_m);
  static constexpr bool q_banded = q_bands > 1;
  static_assert(q_bands == 1 || q_bands == consumer_warpgroups, "a band per consumer warpgroup, or one");
  static constexpr int band_rows = block_m / q_bands;
  static_assert(band_rows % rows_per_pass == 0, "the Q copy's passes must cover each band exactly");
  static constexpr int q_empty_barrier_offset =
      barrier_offset + (kv_split ? 4 : 2) * stages * 8;                               // [q_bands]
  static constexpr int q_full_barrier_offset = q_empty_barrier_offset + 8 * q_bands;  // [q_bands], banded
  static constexpr int landing_barrier_offset = q_full_barrier_offset + (q_banded ? 8 * q_bands : 0);
  // The item schedule (AttentionParams::item_counter): per band an item mbarrier (one producer arrival
  // per item after the CTA's first, and one at the end) and a slot (int, 8 bytes apart: the item its
  // warpgroups take next), and the producers' two (int [2], alternating per item: the item after the
  // current one).
  static constexpr int item_barrier_offset = landing_barrier_offset + (kv_tma_only ? 8 : 0);  // [q_bands]
  static constexpr int consumer_slot_offset = item_barrier_offset + 8 * q_bands;              // [q_bands]
  static constexpr int producer_slots_offset = consumer_slot_offset + 8 * q_bands;
  static constexpr int shared_bytes = alignment_slack + producer_slots_offset + 8;  // 8-byte multiple
  static_assert(shared_bytes ==
                    attention_sm90_shared_bytes(kHeadDim, kBlockN, kStages, kKvFp8, kKvTma, block_m),
                "the layout above and the host's formula (attention_params.h) must agree");

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                "head_dim: 64, 128 or 256 (whole 64-element swizzle column blocks, a wgmma N)");
  static_assert(kBlockN == 64 || kBlockN == 128, "block_n: 64 or 128 keys (a wgmma N, whole k16 steps)");
  static_assert(kGroupSize >= 1, "group_size must be positive");
  static_assert(kHeadsPerCta >= 1 && kHeadsPerCta <= 16 && kGroupSize % kHeadsPerCta == 0,
                "heads_per_cta: a divisor of group_size, at most 16 (at least 8 tokens per CTA)");
  static_assert(kBlockSize >= 1 && (kBlockSize & (kBlockSize - 1)) == 0, "block_size must be a power of two");
  static_assert(block_m % rows_per_pass == 0 && kBlockN % kv_rows_per_pass == 0,
                "the producer's passes must cover the Q and K/V tiles exactly");
  static_assert((kStages >= 2 || (kStages == 1 && kv_split)) && kStages <= 4,
                "stages: 2 to 4, or 1 with K and V on their own barriers (kv_split)");
  static_assert(!kv_split || (kPingPong && !kOverlapSoftmax),
                "kv_split: the serial ping-pong schedule (D 256's)");
  static_assert(!kOverlapSoftmax || kStages >= 3,
                "the overlapped schedule holds two stages per consumer: it needs a third for the producer");
  static_assert(shared_bytes <= 227 * 1024, "the tiles exceed sm_90's 227 KiB of shared memory per block");

  // The TMA boxes of one tile: [64 columns, kv_box_rows slots] (a page, or a tile's share of a larger
  // page), head_dim / 64 column blocks, for K then V; kv_tile_bytes complete on the full barrier.
  static constexpr int kv_box_rows = kBlockSize < kBlockN ? kBlockSize : kBlockN;
  static constexpr int kv_pages_per_tile = kBlockN / kv_box_rows;
  static constexpr int kv_column_blocks = kHeadDim / 64;
  static constexpr int kv_boxes_per_tensor = kv_pages_per_tile * kv_column_blocks;
  static constexpr int kv_boxes = 2 * kv_boxes_per_tensor;  // issued by one producer lane each
  static_assert(kv_boxes == attention_sm90_kv_tma_boxes(kHeadDim, kBlockSize, kBlockN),
                "the box count and the host's formula (attention_params.h) must agree");
  static constexpr unsigned kv_tile_bytes = 2u * kBlockN * kHeadDim * 2u;
  static constexpr unsigned kv_tensor_bytes = kv_tile_bytes / 2;  // K's or V's tile alone (kv_split)
  // Producer lanes with a box: one per box, or with kv_split one per K box, which also issues its V box.
  static constexpr int kv_box_lanes = kv_split ? kv_boxes_per_tensor : kv_boxes;
  static_assert(kv_box_lanes == attention_sm90_kv_tma_box_lanes(kHeadDim, kBlockSize, kBlockN, kKvTma),
                "the box lanes and the host's formula (attention_params.h) must agree");
  static_assert(!kKvTma || (kBlockSize >= 8 && kv_box_lanes <= 32),
                "kv_tma: pages of at least 8 slots (whole 128-byte swizzle atoms) and at most 32 boxes per "
                "tile (one per lane, with kv_split one of K and one of V; more spill the producer's "
                "registers)");
  static_assert(!kKvFp8 || (!kKvTma && kHeadDim <= 128),
                "kv_fp8: the gather path only (codes are widened by the producer), D <= 128 (at D 256 the "
                "staging buffers do not fit beside two bf16 stages)");
};

// grid: [G], G <= ceil(max_query_len / tokens_per_cta) x num_seqs x query_heads / heads_per_cta work items
// (one CTA per item, or persistent: a CTA per SM walking several), block: [Traits::threads], dynamic shared
// memory: Traits::shared_bytes (above 48 KiB: the function attribute must allow it). sm_90a only.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads, 1)
    attention_sm90_kernel(const __grid_constant__ typename Traits::Params kernel_params) {
#if ATTNPLAN_SM90A_ENABLED
  const AttentionParams& params = attention_sm90_detail::common_params(kernel_params);
  using namespace attention_detail;
  using namespace attention_sm90_detail;
  using namespace sm90;
  constexpr int kBlockM = Traits::block_m;
  constexpr int kBlockN = Traits::block_n;
  constexpr int kHeadDim = Traits::head_dim;
  constexpr int kStages = Traits::stages;
  constexpr float kLog2e = 1.4426950408889634f;

  constexpr int kHeads = Traits::heads_per_cta;
  constexpr int kTokens = Traits::tokens_per_cta;

  // Work items: (query tile, sequence, group of kHeads query heads of one kv head), numbered heaviest query
  // tile first (the latest tokens see the most keys under a causal mask), then sequence, then head group, so
  // neighbouring items share their K/V in L2. The grid is 1-D: one CTA per item, or persistent (fewer
  // CTAs than items, one per SM). A CTA's first item is its own index; after it, producer thread 0 claims
  // the next from params.item_counter (0 at the launch: execute's KV store kernel zeroes it), items
  // gridDim.x, gridDim.x + 1, ... in the heaviest-first order, so the CTAs that end early take the heavy
  // items left and the makespan is the greedy one. A load-balance model of item cost (its key tiles plus
  // one for its start and end; tools/attention_balance.py) put the static snake the kernel walked before
  // (CTA b took item r * gridDim.x + b in even rounds r, its mirror in odd ones) 3.3% over the
  // mean load on the 4 x 16k varlen batch at D 128 and 32% on the 4 x 4k bidirectional batch at D 64, the
  // claims 0.2% and 15% (attention-notes.md, "Session 39"). Producer and consumers walk the same items; the
  // stages' barrier phases run on across them (`base`: the tiles of earlier items). Items whose query tile
  // lies past their sequence's chunk (varlen batches) are claimed and passed over.
  //
  // When every chunk is one bidirectional span, an item sees all of its sequence's keys whatever its query
  // tile, so the items of a long sequence are the heavy ones: the host then orders the sequences longest
  // first (params.seq_order) and the items are numbered sequence-major: sequence, head group, then query
  // tile from its last. On the 4 x 4k bidirectional batch the model puts the claims' largest load 1.5-2.6%
  // over the mean rather than 8.5-14.6%; the CTAs running at once also read fewer keys (one kv head of one
  // sequence rather than every kv head of every sequence), which may be why the 4 x 16k batches gained
  // 24-28% on an H100 where the model said 2% (attention-notes.md, "Session 41").
  const int q_tiles = (params.max_query_len + kTokens - 1) / kTokens;
  const int head_groups = params.kv_heads * (Traits::group_size / kHeads);
  // seq_order lists every sequence once (ordered_seqs is 0 or num_seqs: AttentionSpec::check), so both walks
  // number the same items.
  const bool sequence_major = Traits::has_spans && params.ordered_seqs > 0;  // no order without spans
  // Every chunk one span over itself (AttentionParams::whole_chunk_spans): an item sees keys [0, kv_len)
  // and each of its rows the span [context_len, kv_len), with no span array read.
  const bool whole_chunk_spans = Traits::has_spans && params.whole_chunk_spans != 0;
  const int items = q_tiles * params.num_seqs * head_groups;
  // The walk is over work units: the items before the split tail whole, then each split item's parts
  // (AttentionParams::split_items; without a split, unit == item).
  const int split_items = Traits::splits_tail ? params.split_items : 0;
  const int whole_items = items - split_items;
  const int units = whole_items + split_items * params.split_parts;
  // Where unit `unit` lies: its item and part (-1: the whole item), the item's sequence, first head, chunk
  // (query_start, query_len) and first chunk token.
  struct Place {
    int item, part, seq, first_head, query_start, query_len, row_begin;
  };
  auto locate = [&](int unit) {
    Place place;
    place.item = unit;
    place.part = -1;
    if (unit >= whole_items) {  // never without a split: unit < units == items then
      place.item = whole_items + (unit - whole_items) / params.split_parts;
      place.part = (unit - whole_items) % params.split_parts;
    }
    const int item = place.item;
    int tile, group;  // the item's query tile (counted down from the last) and head group
    if (sequence_major) {
      place.seq = params.seq_order[item / (q_tiles * head_groups)];
      group = (item % (q_tiles * head_groups)) / q_tiles;
      tile = item % q_tiles;
    } else {
      place.seq = (item % (params.num_seqs * head_groups)) / head_groups;
      group = item % head_groups;
      tile = item / (params.num_seqs * head_groups);
    }
    place.first_head = group * kHeads;
    place.query_start = params.query_starts[place.seq];
    place.query_len = params.query_starts[place.seq + 1] - place.query_start;
    place.row_begin = (q_tiles - 1 - tile) * kTokens;
    return place;
  };
  // The key tiles to visit, in increasing order and each once (attention.cuh's KeyTileSchedule): the band
  // causality and the window leave, [band_begin, band_end), never empty (every row sees itself), plus the
  // tiles of each span that meets the query tile. Producer and consumers walk the same sequence;
  // next_tile(t) is the one after t (t + 1 without spans: the band is contiguous; with spans t + 1 until
  // the end of t's run of visited tiles, then a pass over the spans: a walker's run_end). schedule_of
  // sets it up for the item at `place` and returns the item's tile count.
  using Schedule = KeyTileSchedule<kBlockN, Traits::has_spans>;
  auto schedule_of = [&](const Place& place, Schedule& schedule) {
    const int q_first = params.context_lens[place.seq] + place.row_begin;
    const int q_last = q_first + min(kTokens, place.query_len - place.row_begin) - 1;
    schedule.band_begin = Traits::has_window ? max(0, q_first - params.window + 1) / kBlockN : 0;
    schedule.band_end = q_last / kBlockN + 1;
    schedule.spans = nullptr;
    schedule.span_count = 0;
    if constexpr (Traits::has_spans) {
      if (whole_chunk_spans) {  // the band is every key tile: no span is attached
        schedule.band_end = (params.context_lens[place.seq] + place.query_len + kBlockN - 1) / kBlockN;
        return schedule.band_end - schedule.band_begin;
      }
      schedule.attach_spans(params, place.seq, q_first, q_last);
      return schedule.count();
    } else {
      return schedule.band_end - schedule.band_begin;
    }
  };
  // A split item's parts, from its tile count: one per tile at most (a part with no tiles is never claimed).
  auto parts_in = [&](int tiles) { return min(params.split_parts, tiles); };
  auto parts_of = [&](const Place& place) {
    Schedule schedule;
    return parts_in(schedule_of(place, schedule));
  };
  auto item_has_rows = [&](int unit) {
    if (unit >= units) return false;
    const Place place = locate(unit);
    return place.row_begin < place.query_len && (place.part < 0 || place.part < parts_of(place));
  };
  // The next unclaimed item (the counter hands out those after each CTA's first).
  auto claim = [&]() { return static_cast<int>(gridDim.x) + atomicAdd(params.item_counter, 1); };
  // `item` or, if it has no rows, the next claimed one that has (`units`: none left). Compared unsigned: a
  // counter that was not zeroed ends the CTA's walk rather than sending it to negative items.
  auto claim_from = [&](int item) {
    while (static_cast<unsigned>(item) < static_cast<unsigned>(units) && !item_has_rows(item)) item = claim();
    return static_cast<unsigned>(item) < static_cast<unsigned>(units) ? item : units;
  };

  // The current unit, set by begin_item: what the producer and consumers read of it.
  int first_head, kv_head, query_start, row_begin, rows, kv_len, q_first, q_last;
  const int* block_table;
  Schedule schedule;  // the item's (schedule_of)
  int first_tile, tile_count, run_end;
  // Keys every row of the item sees through one span that holds all its tokens, [all_rows_span_first,
  // all_rows_span_end): key tiles inside it need no mask (a prompt that is one bidirectional span masks only
  // its last tile). Empty without such a span.
  int all_rows_span_first, all_rows_span_end;
  auto next_tile = [&](int tile) {
    if constexpr (Traits::has_spans) {
      if (tile + 1 < run_end) return tile + 1;
      const int next = schedule.next(tile);
      run_end = schedule.run_end(next);
      return next;
    } else {
      return tile + 1;
    }
  };
  // Sets the unit's state; returns its part (-1: a whole item).
  auto begin_item = [&](int unit) {
    const Place place = locate(unit);
    const int seq = place.seq;
    first_head = place.first_head;  // the item's heads: first_head .. first_head + kHeads - 1
    kv_head = first_head / Traits::group_size;
    query_start = place.query_start;
    row_begin = place.row_begin;                       // first chunk token of this tile (< query_len)
    rows = min(kTokens, place.query_len - row_begin);  // chunk tokens in this tile
    const int context_len = params.context_lens[seq];
    kv_len = context_len + place.query_len;  // keys visible to the chunk: positions [0, kv_len)
    q_first = context_len + row_begin;       // positions of the tile's first and last real tokens
    q_last = q_first + rows - 1;
    block_table = params.block_tables + static_cast<long long>(seq) * params.max_blocks_per_seq;
    tile_count = schedule_of(place, schedule);
    first_tile = schedule.band_begin;
    all_rows_span_first = 0;
    all_rows_span_end = 0;
    if (whole_chunk_spans) {  // one band of tiles; every row in the chunk's span
      all_rows_span_first = context_len;
      all_rows_span_end = kv_len;
      run_end = schedule.band_end;
    } else if constexpr (Traits::has_spans) {
      int first_row_span_last;  // the span of the first token, if it holds the last one too
      schedule.row_span(q_first, kv_len, all_rows_span_first, first_row_span_last);
      if (all_rows_span_first <= first_row_span_last && q_last <= first_row_span_last)
        all_rows_span_end = first_row_span_last + 1;
      first_tile = schedule.next(-1);
      run_end = schedule.run_end(first_tile);
    }
    if (place.part >= 0) {  // part p of n tiles in `parts`: the walk's tiles [p n / parts, (p + 1) n / parts)
      const int parts = parts_in(tile_count);
      const int skipped = place.part * tile_count / parts;
      for (int i = 0; i < skipped; ++i) first_tile = next_tile(first_tile);
      tile_count = (place.part + 1) * tile_count / parts - skipped;
    }
    return place.part;
  };
  extern __shared__ uint4 shared_storage[];
  const unsigned raw_address = sm90::smem_address(shared_storage);
  const unsigned base_address = (raw_address + 1023u) & ~1023u;
  // mbarriers, 8 bytes each: full [stages], empty [stages], then Q's empty barriers [q_bands] and,
  // banded, its full ones [q_bands]
  const unsigned full_barriers = base_address + Traits::barrier_offset;
  const unsigned empty_barriers = full_barriers + kStages * 8;
  // kv_split: the two above are K's, these V's [stages] each.
  const unsigned value_full_barriers = full_barriers + 2 * kStages * 8;
  const unsigned value_empty_barriers = full_barriers + 3 * kStages * 8;
  const unsigned q_empty_barriers = base_address + Traits::q_empty_barrier_offset;
  const unsigned q_full_barriers = base_address + Traits::q_full_barrier_offset;
  // The item schedule's hand-over (Traits: item_barrier_offset): producer thread 0 writes the item band
  // b's warpgroups take next into b's slot after b's Q empty barrier of the item before it (they have
  // read the slot then) and arrives on b's item barrier; the producers read the item after the current
  // one from producer_slots[items begun % 2] after named barrier 4.
  const unsigned item_barriers = base_address + Traits::item_barrier_offset;
  unsigned char* const aligned_storage =
      reinterpret_cast<unsigned char*>(shared_storage) + (base_address - raw_address);
  auto consumer_slot = [&](int band) {
    return reinterpret_cast<int*>(aligned_storage + Traits::consumer_slot_offset + 8 * band);
  };
  int* const producer_slots = reinterpret_cast<int*>(aligned_storage + Traits::producer_slots_offset);
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kStages; ++stage) {
      // full: one hardware arrival per producer thread once its copies of the tile have landed
      mbarrier_init(full_barriers + stage * 8, Traits::producer_threads);
      mbarrier_init(empty_barriers + stage * 8, Traits::consumer_threads);
      if constexpr (Traits::kv_split) {
        mbarrier_init(value_full_barriers + stage * 8, Traits::producer_threads);
        mbarrier_init(value_empty_barriers + stage * 8, Traits::consumer_threads);
      }
    }
    for (int band = 0; band < Traits::q_bands; ++band) {
      // Q's empty: the band's consumer warpgroups have read its rows of an item's Q (their last S = Q K^T
      // has completed), so the producer may copy the next item's over them.
      mbarrier_init(q_empty_barriers + band * 8, Traits::consumer_threads / Traits::q_bands);
      // Q's full, banded: one hardware arrival per producer thread once its copies of the band have landed.
      if constexpr (Traits::q_banded) mbarrier_init(q_full_barriers + band * 8, Traits::producer_threads);
      mbarrier_init(item_barriers + band * 8, 1);
    }
    // TMA only: the boxes of the tile past the keys land here (thread 0's arrival plus their bytes).
    if constexpr (Traits::kv_tma_only) mbarrier_init(base_address + Traits::landing_barrier_offset, 1);
    fence_barrier_init();
    *consumer_slot(0) = claim_from(static_cast<int>(blockIdx.x));
  }
  __syncthreads();
  // The CTA's first item, from thread 0 (the __syncthreads above publishes it).
  const int first_item = *consumer_slot(0);
  if (first_item >= units) return;  // nothing claimed: no barrier is in use yet

  if (threadIdx.x < Traits::producer_threads) {
    // ---- producer: gathers, then hands them to the stage's full barrier ------------------------------
    setmaxnreg_decrease<Traits::producer_registers>();
    // The trace's lane (Traits::traces): producer thread 0, role 0.
    const bool tracer = Traits::traces && threadIdx.x == 0;
    if (tracer) trace_begin(params, 0);
    // Thread layout of the Q copy: `chunks` consecutive threads per row, rows_per_pass rows per pass.
    const int chunk = threadIdx.x % Traits::chunks;
    const int first_row = threadIdx.x / Traits::chunks;
    // Thread layout of a K/V copy: thread parity p moves chunks 2 k + p of rows kv_first_row + pass *
    // kv_rows_per_pass, so a thread looks up one slot per row for chunks / 2 copies of K and as many of V
    // (before step d of attention-notes.md it looked a slot up per 16-byte chunk: most of the producer's
    // instructions were that bookkeeping).
    constexpr int kKvRowsPerPass = Traits::kv_rows_per_pass;
    constexpr int kKvPasses = Traits::kv_passes;
    const int parity = threadIdx.x % 2;
    const int kv_first_row = threadIdx.x / 2;  // rows kv_first_row + 64 pass: the same row % 8 for each pass
    // key_cache / value_cache: [num_blocks * block_size slots, kv_heads, head_dim]
    const long long slot_elements = static_cast<long long>(params.kv_heads) * kHeadDim;
    // Chunk 2 k + p of a row lands at 16 * ((2 k + p) % 8 ^ row % 8) in its 64-column block; as 2 k % 8
    // is even, that is 32 * (k % 4) ^ 16 * (p ^ row % 8): one XOR with a per-thread constant.
    const unsigned chunk_swizzle = 16u * static_cast<unsigned>(parity ^ (kv_first_row % 8));

    // The block table is read a tile ahead: each thread loads the pages of its kKvPasses rows of the
    // next tile while it issues this tile's copies (a warp's 16 rows share one or a few entries, so the
    // loads broadcast). v1 read the table per 16-byte chunk right before each copy: every read waited
    // behind the tile's queued copies, four round trips per tile, and the consumers starved. A row reads
    // zeros for keys past kv_len, pages past max_blocks_per_seq and pages outside [0, num_blocks), as
    // cache_slot says.
    constexpr int kPageRegisters = kKvPasses;
    auto load_pages = [&](int tile, int(&pages)[kPageRegisters]) {
#pragma unroll
      for (int pass = 0; pass < kKvPasses; ++pass) {
        const int position = tile * kBlockN + kv_first_row + pass * kKvRowsPerPass;
        // Positions are never negative: unsigned division and remainder by the page size are a shift and
        // a mask (the compiler cannot see it through the tile schedule).
        const int logical = static_cast<unsigned>(position) / Traits::block_size;
        const bool used = position < kv_len && logical < params.max_blocks_per_seq;
        pages[pass] = used ? __ldg(block_table + logical) : -1;  // checked at use: the load stays in flight
      }
    };
    // TMA (kv_tma): box b of a tile (the K boxes, then V; in each, page by page, 64-column block by block)
    // is lane b / 4 of producer warp b % 4's, which prefetches its page a tile ahead like the gather's rows.
    // TMA takes uniform operands, so a warp issues its lanes' boxes one at a time (an elect loop): spread
    // over the four warps (on four schedulers) the 32 boxes of pages of 16 take 8 rounds, not 32. D 256's
    // TMA-only producer kept them on warp 0 until session 49 (a spill at the time); there its pages of 16
    // ran 14-16% behind pages of 64 and now match them (attention-notes.md "Session 49").
    static_assert(Traits::producer_threads == 128, "boxes spread over four producer warps");
    const int box = threadIdx.x % 32 * 4 + threadIdx.x / 32;
    auto uses_tma = [&](int tile) {
      return Traits::kv_tma && (Traits::kv_tma_only || (tile + 1) * kBlockN <= kv_len);
    };
    auto load_box_page = [&](int tile) {
      const int page_in_tile = (box / Traits::kv_column_blocks) % Traits::kv_pages_per_tile;
      const int logical =
          static_cast<unsigned>(tile * kBlockN + page_in_tile * Traits::kv_box_rows) / Traits::block_size;
      const bool used = box < Traits::kv_box_lanes && logical < params.max_blocks_per_seq;
      return used ? __ldg(block_table + logical) : -1;
    };
    auto prefetch = [&](int tile, int(&pages)[kPageRegisters], int& box_page) {
      if (uses_tma(tile)) {
        box_page = load_box_page(tile);
      } else {
        if constexpr (!Traits::kv_tma_only) load_pages(tile, pages);
      }
    };
    if constexpr (Traits::kv_tma) {
      if (threadIdx.x == 0) {
        prefetch_tensor_map(&kernel_params.key_map);
        prefetch_tensor_map(&kernel_params.value_map);
      }
    }

    // Q [num_tokens, query_heads, head_dim], rows query_row_stride apart; rows past the chunk zero: the
    // rows of band `band`. Banded, their copies land on the band's Q full barrier (load_q); with one band,
    // on the item's first tile's full barrier (the tile loop's arrival covers them). Either way the
    // consumers wait for them with the item's first tile.
    auto copy_q = [&](int band) {
      const bf16_bits* column = params.query + first_head * kHeadDim + chunk * 8;
      constexpr int kBandRows = Traits::band_rows;
#pragma unroll 4
      for (int row = kBandRows * band + first_row; row < kBandRows * (band + 1);
           row += Traits::rows_per_pass) {
        const bool valid = row < Traits::used_rows && row / kHeads < rows;
        const long long token = query_start + row_begin + row / kHeads;
        const bf16_bits* source = column + token * params.query_row_stride + (row % kHeads) * kHeadDim;
        cp_async_16(base_address + Traits::q_offset + swizzle128_offset(row, chunk * 8, kBlockM),
                    valid ? source : params.query, valid ? 16 : 0);
      }
    };

    int base = 0;  // tiles of the CTA's earlier items: tile i of this one uses stage (base + i) % stages
    int items_begun = 0;    // the CTA's items so far
    int landing_phase = 0;  // TMA only: the landing barrier's next phase
    // Q's buffer, band by band: wait until the band's warpgroups have read the previous item's rows, hand
    // them this item, copy their rows of this item's Q and, banded, give the copies to the band's Q full
    // barrier. Banded with TMA K/V this comes after the item's first K/V tile is issued, so that tile's
    // load runs while the consumers finish the previous item (its stage was freed before their last S,
    // which frees Q); the gathering paths keep Q first, as their wait below would otherwise wait for that
    // tile's copies, and so does one band, whose copies ride that tile's full barrier.
    int item_now = first_item;  // the item load_q hands the consumers
    // Band b's next item (or the end marker, `units`) into its slot, which its warpgroups read after
    // their wait on b's item barrier; only once they have released b's Q, so they have read the last one.
    auto hand_over = [&](int band, int next) {
      if (threadIdx.x == 0) {
        *consumer_slot(band) = next;
        mbarrier_arrive(item_barriers + band * 8);
      }
    };
    auto load_q = [&](int band) {
      if (items_begun > 0) {
        mbarrier_wait_parity(q_empty_barriers + band * 8, (items_begun - 1) & 1);
        // This thread's earlier Q copies have landed by now (the consumers waited for them, on their band's
        // Q full barrier or with one band on the first tile's, before releasing Q), so on the TMA path
        // this returns at once; it is here for compute-sanitizer's racecheck, which follows a copy's
        // completion only through its own thread's wait, not through other threads' barriers, and
        // otherwise reports the new Q copy as a write-after-write hazard.
        // wait_all, not wait_group 0: the Q copies go to their barrier uncommitted, outside wait_group's
        // count (racecheck's report on the TMA case, session 43). Before the first band only: later bands
        // would wait for this item's first band's copies, just issued.
        if (band == 0) cp_async_wait_all();
        hand_over(band, item_now);
      }
      copy_q(band);
      if constexpr (Traits::q_banded) cp_async_mbarrier_arrive(q_full_barriers + band * 8);
    };
    auto load_qs = [&]() {
#pragma unroll 1
      for (int band = 0; band < Traits::q_bands; ++band) load_q(band);
    };
    constexpr bool kQAfterFirstTile = Traits::q_banded && Traits::kv_tma && !Traits::kv_fp8;
    for (int item = first_item; item < units;) {
      begin_item(item);
      item_now = item;
      if (tracer) trace_event(params, 0, items_begun, kTraceProducerBegin, item);
      if constexpr (!kQAfterFirstTile) {
        load_qs();
        if (tracer) trace_event(params, 0, items_begun, kTraceProducerQ, item);
      }
      int pages[kPageRegisters];
      int tile = first_tile;
      if constexpr (Traits::kv_fp8) {
        // fp8 codes: the same layout with 1-byte elements; thread parity p gathers the 16-code chunks
        // 2 k + p of its rows into staging buffer i % 2 (tile i), then, once its copies of tile i - 1 have
        // landed, widens those same chunks into the bf16 tiles and arrives. Each thread reads back only what
        // it copied itself, so its own cp.async wait orders the two.
        constexpr int kCodeChunks = kHeadDim / 16;  // 16-byte chunks of codes per row
        // Chunk c of row r of a staging buffer: rows of kHeadDim bytes, the chunk index XOR-ed with the row's
        // place among those sharing a 128-byte bank line, so the 16 rows a warp widens at once spread over
        // all banks (plain rows would put them all on the same 32 bytes: a 16-way conflict).
        constexpr int kRowsPerLine = 128 / kHeadDim;
        auto staged = [](int row, int code_chunk) {
          return static_cast<unsigned>(row * kHeadDim +
                                       16 * (code_chunk ^ ((row / kRowsPerLine) % kCodeChunks)));
        };
        const unsigned char* key_codes =
            reinterpret_cast<const unsigned char*>(params.key_cache) + kv_head * kHeadDim + parity * 16;
        const unsigned char* value_codes =
            reinterpret_cast<const unsigned char*>(params.value_cache) + kv_head * kHeadDim + parity * 16;
        unsigned char* shared_base =
            reinterpret_cast<unsigned char*>(shared_storage) + (base_address - raw_address);
        load_pages(tile, pages);
        for (int i = 0; i <= tile_count; ++i) {
          int next_pages[kPageRegisters];
          int following = tile;
          if (i < tile_count) {
            following = i + 1 < tile_count ? next_tile(tile) : tile;
            if (i + 1 < tile_count) load_pages(following, next_pages);
            const unsigned buffer =
                base_address + Traits::staging_offset + (i % 2) * Traits::staging_buffer_bytes;
            const int key_first = tile * kBlockN;
#pragma unroll
            for (int pass = 0; pass < kKvPasses; ++pass) {
              const int row = kv_first_row + pass * kKvRowsPerPass;
              long long slot;
              const bool valid =
                  key_slot<Traits::block_size>(pages[pass], key_first + row, params.num_blocks, kv_len, slot);
              const unsigned char* key_row = valid ? key_codes + slot * slot_elements : key_codes;
              const unsigned char* value_row = valid ? value_codes + slot * slot_elements : value_codes;
              const int bytes = valid ? 16 : 0;
#pragma unroll
              for (int k = 0; k < kCodeChunks / 2; ++k) {
                const unsigned offset = staged(row, 2 * k + parity);
                cp_async_16(buffer + offset, key_row + 32 * k, bytes);
                cp_async_16(buffer + kBlockN * kHeadDim + offset, value_row + 32 * k, bytes);
              }
            }
          }
          cp_async_commit();
          if (i >= 1) {
            cp_async_wait<1>();  // tile i - 1's codes (and Q) have landed; tile i's may still be in flight
            const int done = base + i - 1;  // tile i - 1 of the item
            const int stage = done % kStages;
            if (done >= kStages) mbarrier_wait_parity(empty_barriers + stage * 8, ((done / kStages) - 1) & 1);
            const unsigned char* buffer =
                shared_base + Traits::staging_offset + ((i - 1) % 2) * Traits::staging_buffer_bytes;
            unsigned char* k_tile = shared_base + Traits::k_offset + stage * Traits::k_bytes;
            unsigned char* v_tile = shared_base + Traits::v_offset + stage * Traits::v_bytes;
            // Not unrolled: the hoisted addresses of every pass would exceed the producer's registers.
#pragma unroll 1
            for (int pass = 0; pass < kKvPasses; ++pass) {
              const int row = kv_first_row + pass * kKvRowsPerPass;
#pragma unroll
              for (int k = 0; k < kCodeChunks / 2; ++k) {
                const int code_chunk = 2 * k + parity;  // bf16 chunks 2 c and 2 c + 1 of the row
                const unsigned low = swizzle128_offset(row, 16 * code_chunk, kBlockN);
                const unsigned high = swizzle128_offset(row, 16 * code_chunk + 8, kBlockN);
#pragma unroll
                for (int tensor = 0; tensor < 2; ++tensor) {  // K, then V: one chunk live at a time
                  const uint4 codes = *reinterpret_cast<const uint4*>(buffer + tensor * kBlockN * kHeadDim +
                                                                      staged(row, code_chunk));
                  unsigned char* tile_base = tensor == 0 ? k_tile : v_tile;
                  *reinterpret_cast<uint4*>(tile_base + low) = fp8x8_to_bf16x8(make_uint2(codes.x, codes.y));
                  *reinterpret_cast<uint4*>(tile_base + high) = fp8x8_to_bf16x8(make_uint2(codes.z, codes.w));
                }
              }
            }
            mbarrier_arrive(full_barriers + stage * 8);
            if (tracer && i == 1) trace_event(params, 0, items_begun, kTraceProducerFirstTile, item);
          }
          if (i < tile_count) {
#pragma unroll
            for (int r = 0; r < kPageRegisters; ++r) pages[r] = next_pages[r];
            tile = following;
          }
        }
      } else {
        const bf16_bits* key_head = params.key_cache + kv_head * kHeadDim + parity * 8;
        const bf16_bits* value_head = params.value_cache + kv_head * kHeadDim + parity * 8;
        int box_page = -1;
        prefetch(tile, pages, box_page);
        // TMA: box `in_tensor` of the K or V tile at tensor_address, from `map` (its page this lane's
        // box_page, its 64-column block), completing on `barrier`. A page outside the pool (or past the
        // block table) loads a box wholly before the map's first slot: TMA writes zeros there, as the gather
        // does. The caller names the map: only the TMA kernels' parameters hold one.
        auto issue_box = [&](int in_tensor, int key_first, unsigned tensor_address, const void* map,
                             unsigned barrier) {
          const int page_in_tile = in_tensor / Traits::kv_column_blocks;
          const int column_block = in_tensor % Traits::kv_column_blocks;
          const int position = key_first + page_in_tile * Traits::kv_box_rows;
          const int slot = box_page >= 0 && box_page < params.num_blocks
                               ? box_page * Traits::block_size +
                                     static_cast<int>(static_cast<unsigned>(position) % Traits::block_size)
                               : -Traits::kv_box_rows;
          tma_load_2d(
              tensor_address + column_block * kBlockN * 128u + page_in_tile * Traits::kv_box_rows * 128u, map,
              barrier, kv_head * kHeadDim + column_block * 64, slot);
        };
        // TMA: thread 0 announces `bytes` of boxes on `full`, or, for the tile reaching past the keys (TMA
        // only), on the landing barrier with its own arrival there (the producer arrives on `full` itself
        // once it has zeroed V's rows past the keys). The bytes come first: this thread's arrival is one the
        // phase still needs, so other warps' boxes completing before the expect_tx only dip the count.
        const unsigned landing = base_address + Traits::landing_barrier_offset;
        auto expect_bytes = [&](unsigned full, bool past_keys, unsigned bytes) {
          if (threadIdx.x == 0) {
            if (past_keys) {
              mbarrier_arrive_expect_tx(landing, bytes);
            } else {
              mbarrier_expect_tx(full, bytes);
            }
          }
          __syncwarp();
        };
        // TMA only: once the tile past the keys has landed, V rows [zero_from, block_n) of it at v_address:
        // every 16-byte chunk of each row, so the swizzle (a permutation inside a row) does not matter.
        auto zero_values_past = [&](unsigned v_address, int zero_from) {
          mbarrier_wait_parity(landing, landing_phase);
          landing_phase ^= 1;
          uint4* v_tile = reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(shared_storage) +
                                                   (v_address - raw_address));
          for (int index = threadIdx.x; index < (kBlockN - zero_from) * Traits::chunks;
               index += Traits::producer_threads) {
            const int row = zero_from + index / Traits::chunks;
            const int chunk_in_row = index % Traits::chunks;  // column block chunk_in_row / 8
            v_tile[(chunk_in_row / 8) * kBlockN * 8 + row * 8 + chunk_in_row % 8] = make_uint4(0, 0, 0, 0);
          }
        };

        for (int i = 0; i < tile_count; ++i) {
          const int stage = (base + i) % kStages;
          int next_pages[kPageRegisters];
          int next_box_page = -1;
          const int following = i + 1 < tile_count ? next_tile(tile) : tile;
          if (i + 1 < tile_count) prefetch(following, next_pages, next_box_page);
          if constexpr (Traits::kv_split) {
            // K, then V, each after its own release: K(i) once both warpgroups' S(i - 1) have read K, V(i)
            // once their P V(i - 1) have read V. Every box by TMA; the tile past the keys has its V rows
            // zeroed as below. Q follows the item's first K, ahead of its V.
            const int key_first = tile * kBlockN;
            const int phase = (((base + i) / kStages) - 1) & 1;
            const bool past_keys = key_first + kBlockN > kv_len;
            const unsigned k_full = full_barriers + stage * 8;
            if (base + i >= kStages) mbarrier_wait_parity(empty_barriers + stage * 8, phase);
            expect_bytes(k_full, /*past_keys=*/false, Traits::kv_tensor_bytes);
            if (box < Traits::kv_box_lanes)
              issue_box(box, key_first, base_address + Traits::k_offset + stage * Traits::k_bytes,
                        &kernel_params.key_map, k_full);
            mbarrier_arrive(k_full);
            if (tracer && i == 0) trace_event(params, 0, items_begun, kTraceProducerFirstTile, item);
            if (kQAfterFirstTile && i == 0) {
              load_qs();
              if (tracer) trace_event(params, 0, items_begun, kTraceProducerQ, item);
            }
            const unsigned v_address = base_address + Traits::v_offset + stage * Traits::v_bytes;
            const unsigned v_full = value_full_barriers + stage * 8;
            if (base + i >= kStages) mbarrier_wait_parity(value_empty_barriers + stage * 8, phase);
            expect_bytes(v_full, past_keys, Traits::kv_tensor_bytes);
            if (box < Traits::kv_box_lanes)
              issue_box(box, key_first, v_address, &kernel_params.value_map, past_keys ? landing : v_full);
            if (past_keys) zero_values_past(v_address, kv_len - key_first);
            mbarrier_arrive(v_full);  // after this thread's zeroing stores (release)
            box_page = next_box_page;
            tile = following;
            continue;
          }
          // Reusing a stage: wait until both consumers released its previous tile (base + i - stages).
          if (base + i >= kStages)
            mbarrier_wait_parity(empty_barriers + stage * 8, (((base + i) / kStages) - 1) & 1);
          const int key_first = tile * kBlockN;
          const unsigned k_address = base_address + Traits::k_offset + stage * Traits::k_bytes;
          const unsigned v_address = base_address + Traits::v_offset + stage * Traits::v_bytes;
          const unsigned full = full_barriers + stage * 8;
          // TMA only: the tile reaching past the keys lands on the landing barrier; the producer then zeroes
          // its V rows past kv_len and arrives on the full barrier itself (at most one such tile per item).
          const bool past_keys = Traits::kv_tma_only && key_first + kBlockN > kv_len;
          if (uses_tma(tile)) {
            if constexpr (Traits::kv_tma) {
              expect_bytes(full, past_keys, Traits::kv_tile_bytes);
              if (box < Traits::kv_boxes) {
                const bool value = box >= Traits::kv_boxes_per_tensor;
                issue_box(box % Traits::kv_boxes_per_tensor, key_first, value ? v_address : k_address,
                          value ? &kernel_params.value_map : &kernel_params.key_map,
                          past_keys ? landing : full);
              }
              if (past_keys) zero_values_past(v_address, kv_len - key_first);
            }
          } else if constexpr (!Traits::kv_tma_only) {
#pragma unroll
            for (int pass = 0; pass < kKvPasses; ++pass) {
              const int row = kv_first_row + pass * kKvRowsPerPass;
              long long slot;
              const bool valid =
                  key_slot<Traits::block_size>(pages[pass], key_first + row, params.num_blocks, kv_len, slot);
              const bf16_bits* key_row = valid ? key_head + slot * slot_elements : params.key_cache;
              const bf16_bits* value_row = valid ? value_head + slot * slot_elements : params.value_cache;
              const int bytes = valid ? 16 : 0;
              const unsigned row_offset = row * 128u;
#pragma unroll
              for (int k = 0; k < Traits::chunks / 2; ++k) {
                // column block (2 k) / 8 = k / 4, then the swizzled chunk inside its 128-byte row
                const unsigned offset =
                    (k / 4) * kBlockN * 128u + row_offset + ((32u * (k % 4)) ^ chunk_swizzle);
                cp_async_16(k_address + offset, valid ? key_row + 16 * k : key_row, bytes);
                cp_async_16(v_address + offset, valid ? value_row + 16 * k : value_row, bytes);
              }
            }
          }
          // No wait here: the barrier gets this thread's arrival when its copies (Q on the first tile, the
          // gather) have landed, and the producer goes on to the next free stage (v1 waited for each tile's
          // copies, which left the consumers idle for a tile's load latency whenever both stages were in
          // use). After zeroing, the arrival must also publish this thread's stores: wait for its copies (Q)
          // and arrive plainly (release), as the fp8 path does.
          if (past_keys) {
            cp_async_wait<0>();
            mbarrier_arrive(full);
          } else {
            cp_async_mbarrier_arrive(full);
          }
          if (tracer && i == 0) trace_event(params, 0, items_begun, kTraceProducerFirstTile, item);
          if (kQAfterFirstTile && i == 0) {
            load_qs();
            if (tracer) trace_event(params, 0, items_begun, kTraceProducerQ, item);
          }
#pragma unroll
          for (int r = 0; r < kPageRegisters; ++r) pages[r] = next_pages[r];
          box_page = next_box_page;
          tile = following;
        }
      }
      // The next item, claimed now, with this item's last tiles still ahead of the consumers (their run
      // covers the atomic's round trip), not at its start: claimed an item ahead, the CTAs would take items
      // in the order they began their previous ones rather than the order they become free (the model's 4 x
      // 4k bidirectional batch: 1.18 over the mean load instead of 1.15).
      if (tracer) trace_event(params, 0, items_begun, kTraceProducerLastTile, item);
      if (threadIdx.x == 0) producer_slots[items_begun % 2] = claim_from(claim());
      producer_barrier_sync();
      const int upcoming = producer_slots[items_begun % 2];
      if (tracer) trace_event(params, 0, items_begun, kTraceProducerClaimed, item);
      // Its Q into L2, now that this item's tiles are all issued and the producer would only wait for the
      // consumers to finish with Q: at the item boundary its copy then starts from L2 rather than device
      // memory. A token's kHeads rows are contiguous: one bulk prefetch each. TMA K/V only: the gathering
      // producer has no register left for it at 56 (ptxas spills).
      if (Traits::kv_tma && upcoming < units) {
        const Place next = locate(upcoming);
        const int next_rows = min(kTokens, next.query_len - next.row_begin);
        for (int t = threadIdx.x; t < next_rows; t += Traits::producer_threads) {
          const long long token = next.query_start + next.row_begin + t;
          prefetch_l2(params.query + token * params.query_row_stride + next.first_head * kHeadDim,
                      kHeads * kHeadDim * 2);
        }
      }
      if (tracer) trace_event(params, 0, items_begun, kTraceProducerPrefetched, item);
      base += tile_count;
      ++items_begun;
      item = upcoming;
    }
    // The end marker, once each band's warpgroups have read the last item's slot.
    for (int band = 0; band < Traits::q_bands; ++band) {
      mbarrier_wait_parity(q_empty_barriers + band * 8, (items_begun - 1) & 1);
      hand_over(band, units);
    }
    cp_async_wait_all();  // no copy outlives its thread
    if (tracer) trace_end(params, 0, items_begun);
    return;
  }

  // ---- consumers ------------------------------------------------------------------------------------
  setmaxnreg_increase<Traits::consumer_registers>();
  constexpr int kScoreRegisters = kBlockN / 2;    // S [64, block_n] fp32 over 128 threads
  constexpr int kOutputRegisters = kHeadDim / 2;  // O [64, head_dim] fp32 over 128 threads
  constexpr int kPSteps = kBlockN / 16;           // k16 steps of O += P V
  // rows consumer * 64 .. + 63 of the CTA's tile; broadcast from lane 0, so ptxas knows it is warp-uniform
  const int consumer = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0) - 1;
  const int warp = (threadIdx.x / 32) % 4;  // rows 16 * warp .. of the consumer's 64
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;     // accumulator rows group and group + 8 of the warp's 16
  const int in_group = lane % 4;  // accumulator columns 2 * in_group + {0, 1} of each n8 tile
  const int warp_row = consumer * 64 + warp * 16;  // first CTA row of this warp

  // The keys this thread's two rows may see in the current item, as a closed position range each: the
  // band causality and the window leave, widened to the row's span where it has one.
  int row_band_first[2], row_band_last[2];

  // Online softmax state. row_max holds raw scores (q . k): scale > 0 (validated), so the max commutes
  // with it and each probability is one FFMA + exp2: exp2(s * scale * log2(e) - max * scale * log2(e)).
  // With a softcap (x = c tanh(scale / c q . k)) the scores are first mapped to t = tanh(scale / c q . k)
  // and row_max holds those: c > 0, so the max commutes with c too, and score_multiplier c log2(e) joins the
  // same FFMA (one multiplier register, no FMUL per score: with 128-key tiles at D 256 the separate
  // c log2(e) had spilled). row_sum is this thread's partial over its columns, added across the quad at
  // the end.
  float row_max[2], row_sum[2];
  float output[kOutputRegisters];
  // fp8: q . k is computed against the codes, so k_scale joins the score scale.
  const float score_scale = Traits::kv_fp8 ? params.scale * params.k_scale : params.scale;
  const float tanh_multiplier = Traits::has_softcap ? score_scale / params.softcap : 0.0f;
  const float score_multiplier = (Traits::has_softcap ? params.softcap : score_scale) * kLog2e;
  // The state above at the start of a unit (begin_item set); `part` is its part (-1: a whole item). A sink
  // joins part 0 alone of a split item, so the merge counts it once.
  auto begin_rows = [&](int part) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int position = q_first + (warp_row + group + 8 * half) / kHeads;
      row_band_last[half] = min(position, kv_len - 1);
      row_band_first[half] = Traits::has_window ? position - params.window + 1 : 0;
      if constexpr (Traits::has_spans) {
        // A key is visible through the band or through the row's span. Both hold the row itself (a row in
        // no span has first > last), so their union is one range, and the mask needs no span registers:
        // with 128-key tiles at D 256 (kv_split) these four spilled beside S and O.
        int span_first = 0, span_last = -1;
        if (whole_chunk_spans) {
          span_first = all_rows_span_first;
          span_last = all_rows_span_end - 1;
        } else {
          schedule.row_span(position, kv_len, span_first, span_last);
        }
        if (span_first <= span_last) {
          row_band_first[half] = min(row_band_first[half], span_first);
          row_band_last[half] = max(row_band_last[half], span_last);
        }
      }
      row_max[half] = minus_infinity();
      row_sum[half] = 0.0f;
      if (Traits::has_sinks && part <= 0) {
        // A sink S joins the denominator only (as in attention.cuh): the running max starts at S in the
        // units row_max keeps (raw scores: S / score_scale; with a softcap S / c) and the running sum at
        // exp(0) = 1, in one thread of the quad (the four partial sums are added at the end), with no value
        // row.
        const int head = first_head + (warp_row + group + 8 * half) % kHeads;
        row_max[half] = params.sinks[head] / (Traits::has_softcap ? params.softcap : score_scale);
        row_sum[half] = in_group == 0 ? 1.0f : 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kOutputRegisters; ++i) output[i] = 0.0f;
  };

  // This warpgroup's 64 Q rows start 64 * 128 bytes into each column block (row % 8 == 0: no swizzle shift).
  const unsigned q_address = base_address + Traits::q_offset + swizzle128_offset(consumer * 64, 0, kBlockM);

  // Tile i of the current item (key tile `tile`) uses stage (base + i) % stages.
  int base = 0;
  const int band = Traits::q_banded ? consumer : 0;  // this warpgroup's band of Q
  int q_phase = 0;  // banded: this warpgroup's Q full barrier, one phase per item
  auto wait_full = [&](int i, int tile) {
    if (Traits::q_banded && i == 0) {
      mbarrier_wait_parity(q_full_barriers + band * 8, q_phase);
      q_phase ^= 1;
    }
    mbarrier_wait_parity(full_barriers + ((base + i) % kStages) * 8, ((base + i) / kStages) & 1);
    // The wgmma reads through the async proxy; generic-proxy writes into the stage need a proxy fence
    // first: the cp.async gathers (every tile off the TMA path: all of them without kv_tma, the tile
    // reaching past the keys at D <= 128), Q's copy (it lands with the item's first tile) and,
    // TMA only, the zeroed V rows of the tile past the keys. A tile that TMA alone wrote needs none, and
    // skips the fence's MEMBAR.ALL.CTA between the barrier wait and the S = Q K^T issue.
    // kv_split: this is K's barrier, which TMA alone writes; the zeroed V rows are fenced in wait_values.
    if (!Traits::kv_tma || i == 0 || (!Traits::kv_split && (tile + 1) * kBlockN > kv_len))
      fence_proxy_async_shared();
  };
  // With kv_split, K's: the stage's K has been read (S landed); otherwise the whole stage.
  auto release = [&](int i) { mbarrier_arrive(empty_barriers + ((base + i) % kStages) * 8); };
  // kv_split: V of tile i, before P V (i), and its release once P V (i) has landed.
  auto wait_values = [&](int i, int tile) {
    mbarrier_wait_parity(value_full_barriers + ((base + i) % kStages) * 8, ((base + i) / kStages) & 1);
    if ((tile + 1) * kBlockN > kv_len) fence_proxy_async_shared();
  };
  auto release_values = [&](int i) { mbarrier_arrive(value_empty_barriers + ((base + i) % kStages) * 8); };

  // S = Q K^T of tile i: [64, block_n], head_dim / 16 k-steps; a 16-wide step is 32 bytes into a 64-wide
  // column block, and every 4 steps the next column block begins. Issued and committed, not waited for.
  // Descriptors are built once per tile and stepped by adding (byte offset / 16) to the start-address
  // field (bits 0-13): shared addresses stay below 2^18, so the field never carries into the next.
  const unsigned long long q_descriptor = kmajor_descriptor(q_address);
  auto issue_scores = [&](float(&score)[kScoreRegisters], int i) {
    const unsigned long long k_descriptor =
        kmajor_descriptor(base_address + Traits::k_offset + ((base + i) % kStages) * Traits::k_bytes);
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const unsigned long long a = q_descriptor + ((k / 4) * kBlockM * 128 + (k % 4) * 32) / 16;
      const unsigned long long b = k_descriptor + ((k / 4) * kBlockN * 128 + (k % 4) * 32) / 16;
      wgmma_ss<kBlockN>(score, a, b, /*accumulate=*/k > 0);
    }
    wgmma_commit_group();
  };

  // O += P V of tile i: V [block_n keys, head_dim] is the N-major B operand; k-step k starts 16 rows (2048
  // bytes) further, and the descriptor's leading offset steps from one 64-column block to the next.
  auto issue_pv = [&](const unsigned(&p)[kPSteps][4], int i) {
    const unsigned long long v_descriptor = mnmajor_descriptor(
        base_address + Traits::v_offset + ((base + i) % kStages) * Traits::v_bytes, kBlockN * 128);
#pragma unroll
    for (int k = 0; k < kPSteps; ++k)
      wgmma_rs<kHeadDim, /*kTransposeB=*/1>(output, p[k], v_descriptor + (k * 16 * 128) / 16,
                                            /*accumulate=*/true);
    wgmma_commit_group();
  };

  // Masks (boundary tiles only: a tile wholly below every row's diagonal, above every row's window edge
  // and inside the keys needs none), the new running max, probabilities in place of the scores, the row
  // sums; sets the factor O must be rescaled by and returns false only when every row of the warp kept
  // its max (lazy_rescale: each factor is then 1 and the rescale may be skipped).
  auto softmax = [&](float(&score)[kScoreRegisters], int tile, float(&correction)[2]) -> bool {
    if constexpr (Traits::has_softcap) {  // before the mask: tanh would turn -inf into a finite -1
#pragma unroll
      for (int j = 0; j < kScoreRegisters; ++j) score[j] = fast_tanh(score[j] * tanh_multiplier);
    }
    const int key_first = tile * kBlockN;
    bool needs_mask = key_first + kBlockN - 1 > q_first || key_first + kBlockN > kv_len;
    if constexpr (Traits::has_window) needs_mask = needs_mask || key_first <= q_last - params.window;
    if constexpr (Traits::has_spans)
      needs_mask =
          needs_mask && !(all_rows_span_first <= key_first && key_first + kBlockN <= all_rows_span_end);
    if (needs_mask) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int column = key_first + 2 * in_group;
        const int visible_first = row_band_first[half] - column;
        const int visible_last = row_band_last[half] - column;
#pragma unroll
        for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = n * 8 + e;  // relative to key_first + 2 * in_group
            bool allowed = visible_first <= key && key <= visible_last;
            if (!allowed) score[4 * n + 2 * half + e] = minus_infinity();
          }
        }
      }
    }
    // Max and sum in 4 independent chains per row (a single chain of block_n / 4 dependent FMNMX or
    // FADD stalls on each one's latency; ncu showed those waits as a tenth of the consumers' time).
    constexpr int kChains = 4;
    float chain_max[2][kChains];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int c = 0; c < kChains; ++c) chain_max[half][c] = minus_infinity();
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
        chain_max[half][n % kChains] =
            fmaxf(chain_max[half][n % kChains], fmaxf(score[4 * n + 2 * half], score[4 * n + 2 * half + 1]));
    }
    float base[2];
    // Row `half`'s running max becomes `max` (its own or the tile's higher one): base and correction.
    auto settle = [&](int half, float max) {
      // Nothing allowed yet in this row: subtract 0 so that exp2(-inf - base) stays 0 rather than NaN.
      base[half] = max == minus_infinity() ? 0.0f : max * score_multiplier;
      correction[half] = fast_exp2(row_max[half] * score_multiplier - base[half]);  // 1 when kept
      row_max[half] = max;
    };
    float new_max[2];
    bool grows = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float tile_max =
          fmaxf(fmaxf(chain_max[half][0], chain_max[half][1]), fmaxf(chain_max[half][2], chain_max[half][3]));
      new_max[half] = fmaxf(row_max[half], quad_max(tile_max));
      if constexpr (Traits::lazy_rescale)  // from -inf to a finite max is +inf: a row's first tile moves it
        grows = grows || (new_max[half] - row_max[half]) * score_multiplier > Traits::rescale_threshold;
      else
        settle(half, new_max[half]);
    }
    bool moves = true;
    if constexpr (Traits::lazy_rescale) {
      moves = __any_sync(0xffffffffu, grows);
#pragma unroll
      for (int half = 0; half < 2; ++half) settle(half, moves ? new_max[half] : row_max[half]);
    }
    float chain_sum[2][kChains] = {};
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = score[4 * n + 2 * half + e];
          const float exponent = fmaf(x, score_multiplier, -base[half]);
          x = n % 8 >= 8 - Traits::polynomial_exp_eighths ? polynomial_exp2(exponent) : fast_exp2(exponent);
          chain_sum[half][n % kChains] += x;
        }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float partial =
          (chain_sum[half][0] + chain_sum[half][1]) + (chain_sum[half][2] + chain_sum[half][3]);
      row_sum[half] = row_sum[half] * correction[half] + partial;
    }
    return moves;
  };

  auto rescale = [&](const float(&correction)[2]) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        output[4 * j + 2 * half] *= correction[half];
        output[4 * j + 2 * half + 1] *= correction[half];
      }
    }
  };

  // P as bf16 A fragments: the S accumulators of n8 tiles 2k and 2k + 1 are k-step k's fragment.
  auto pack = [&](const float(&score)[kScoreRegisters], unsigned(&p)[kPSteps][4]) {
#pragma unroll
    for (int k = 0; k < kPSteps; ++k) {
#pragma unroll
      for (int r = 0; r < 4; ++r) p[k][r] = pack_bf16(score[8 * k + 2 * r], score[8 * k + 2 * r + 1]);
    }
  };

  // Ping-pong turns around each point where a warpgroup issues wgmmas, round-robin: every warpgroup has
  // the same number of such points (the same items and tiles), warpgroup 0 goes first (the last warpgroup
  // arrives for it once at the start) and each hands its turn to the next. The last warpgroup's hand-back
  // after its last point is taken by warpgroup 0 once the walk has ended (end_turns), so every bar.arrive
  // is matched without knowing, at that point, which item is the CTA's last (the claimed walk learns it
  // only after the item).
  constexpr int kLastConsumer = Traits::consumer_warpgroups - 1;
  if constexpr (Traits::ping_pong) {
    if (consumer == kLastConsumer) named_barrier_arrive(1);
  }
  auto begin_turn = [&]() {
    if constexpr (Traits::ping_pong) named_barrier_sync(1 + consumer);
  };
  auto end_turn = [&]() {
    if constexpr (Traits::ping_pong) named_barrier_arrive(consumer == kLastConsumer ? 1 : 2 + consumer);
  };
  auto end_turns = [&]() {
    if constexpr (Traits::ping_pong) {
      if (consumer == 0) named_barrier_sync(1);
    }
  };

  // The stagger (two consumer warpgroups on the overlapped schedule, no ping-pong): at each unit's start
  // warpgroup 1 issues its S(0) only once warpgroup 0's first softmax is done (named barrier 6), so that
  // one's first softmax runs under the other's first S, and its last P V and stores under the other's last
  // softmax; with Q in bands (Traits::q_bands) nothing at the next unit's start brings them back into
  // step. Warpgroup 0 in turn starts a unit only once warpgroup 1 has issued its S(0) of the unit before
  // (named barrier 7), so it never leads by a whole unit and every arrival on barrier 6 meets its own
  // bar.sync. Warpgroup 1's hand-back after its last unit is taken at the end (end_stagger). This
  // protocol, with the producer's order and the bands' barriers, is modelled in
  // tools/attention_q_bands_model.py (ctest: no deadlock, no second arrival; broken variants fail).
  constexpr bool kStaggered =
      Traits::overlap_softmax && !Traits::ping_pong && Traits::consumer_warpgroups == 2;
  if constexpr (kStaggered) {
    if (consumer == 1) named_barrier_arrive(7);
  }
  auto stagger_first = [&]() {  // before the unit's S(0)
    if constexpr (kStaggered) named_barrier_sync(consumer == 0 ? 7 : 6);
  };
  auto end_stagger = [&]() {
    if constexpr (kStaggered) {
      if (consumer == 0) named_barrier_sync(7);
    }
  };

  // The consumers have read Q (every S = Q K^T of the item has completed): the producer may load the next.
  auto release_q = [&]() { mbarrier_arrive(q_empty_barriers + band * 8); };

  // The end of a split item's part (AttentionParams::split_partials): leaves this part's O and row
  // statistics there, counts the part in, and returns whether it was the item's last, which then merges the
  // others' into its own registers (as the online softmax merges tiles: each side scaled to the larger
  // max) and stores the rows. Consumer thread t's float4 v of a part is at v * consumer_threads + t, so each
  // warp moves 512 contiguous bytes, and the reader's fragments are the writer's.
  auto merge_parts = [&](const Place& place) {
    constexpr int kVectors = kOutputRegisters / 4;  // O's float4s per thread; vector kVectors: the statistics
    constexpr long long kUnitVectors = attention_sm90_split_unit_floats(kHeadDim, kBlockM) / 4;
    static_assert(kUnitVectors == (kVectors + 1) * Traits::consumer_threads,
                  "a part's partial: O and 4 statistics per consumer thread (attention_params.h)");
    const int slot = place.item - whole_items;
    float4* const partials = reinterpret_cast<float4*>(params.split_partials) +
                             static_cast<long long>(slot) * params.split_parts * kUnitVectors +
                             (threadIdx.x - Traits::producer_threads);
    auto vector = [&](int part, int v) {
      return partials + part * kUnitVectors + v * Traits::consumer_threads;
    };
#pragma unroll
    for (int v = 0; v < kVectors; ++v)
      *vector(place.part, v) =
          make_float4(output[4 * v], output[4 * v + 1], output[4 * v + 2], output[4 * v + 3]);
    *vector(place.part, kVectors) = make_float4(row_max[0], row_max[1], row_sum[0], row_sum[1]);
    // Every consumer thread's partial written (the barrier), one thread counts the part in: its fence
    // before the count releases what the barrier ordered before it (fences are cumulative), its fence after
    // acquires the other parts' partials, which the barrier below then orders before every thread's reads
    // (ld.global.cg: from L2, where the other SMs' writes are).
    consumers_barrier_sync<Traits::consumer_threads>();
    const int parts = parts_of(place);
    bool last = false;
    if (threadIdx.x == Traits::producer_threads) {
      __threadfence();
      last = atomicAdd(params.split_counters + slot, 1) == parts - 1;
      __threadfence();
    }
    // Broadcast from lane 0 so ptxas knows the branch is warp-uniform (bar.red's result is, but ptxas does
    // not know it: it then spilled up to 220 bytes around the merge and the stores).
    if (!__shfl_sync(0xffffffffu, consumers_barrier_or<Traits::consumer_threads>(last), 0)) return false;
    // The parts' statistics first (the merged maxima, each part's weight: the online softmax's rescale to
    // them), then O a few vectors at a time from every part: not a part's whole O beside this one's.
    auto other = [&](int part) { return part < parts && part != place.part; };
    float their_max[kAttentionMaxSplitParts][2], their_sum[kAttentionMaxSplitParts][2];
    float max[2] = {row_max[0], row_max[1]};
#pragma unroll
    for (int part = 0; part < kAttentionMaxSplitParts; ++part) {
      const float4 statistics = other(part) ? __ldcg(vector(part, kVectors))
                                            : make_float4(minus_infinity(), minus_infinity(), 0.0f, 0.0f);
      their_max[part][0] = statistics.x;
      their_max[part][1] = statistics.y;
      their_sum[part][0] = statistics.z;
      their_sum[part][1] = statistics.w;
      max[0] = fmaxf(max[0], statistics.x);
      max[1] = fmaxf(max[1], statistics.y);
    }
    float mine[2], weight[kAttentionMaxSplitParts][2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float base = max[half] == minus_infinity() ? 0.0f : max[half] * score_multiplier;  // as settle
      mine[half] = fast_exp2(row_max[half] * score_multiplier - base);
      row_sum[half] *= mine[half];
#pragma unroll
      for (int part = 0; part < kAttentionMaxSplitParts; ++part) {
        weight[part][half] = fast_exp2(their_max[part][half] * score_multiplier - base);  // 0: not a part
        row_sum[half] += their_sum[part][half] * weight[part][half];
      }
      row_max[half] = max[half];
    }
    constexpr int kChunk = 4;  // vectors merged at a time
    static_assert(kVectors % kChunk == 0);
#pragma unroll
    for (int first = 0; first < kVectors; first += kChunk) {
      // Accumulators 4 v and 4 v + 1 are row half 0's, 4 v + 2 and 4 v + 3 half 1's.
#pragma unroll
      for (int v = first; v < first + kChunk; ++v) {
        output[4 * v] *= mine[0];
        output[4 * v + 1] *= mine[0];
        output[4 * v + 2] *= mine[1];
        output[4 * v + 3] *= mine[1];
      }
#pragma unroll
      for (int part = 0; part < kAttentionMaxSplitParts; ++part) {
        if (!other(part)) continue;
#pragma unroll
        for (int v = first; v < first + kChunk; ++v) {
          const float4 o = __ldcg(vector(part, v));
          output[4 * v] += o.x * weight[part][0];
          output[4 * v + 1] += o.y * weight[part][0];
          output[4 * v + 2] += o.z * weight[part][1];
          output[4 * v + 3] += o.w * weight[part][1];
        }
      }
    }
    return true;
  };

  float score[kScoreRegisters];
  unsigned p[kPSteps][4];
  float correction[2];
  // The trace's lane (Traits::traces): each consumer warpgroup's first thread, role 1 + consumer.
  const bool tracer = Traits::traces && threadIdx.x % 128 == 0;
  if (tracer) trace_begin(params, 1 + consumer);
  int items_done = 0;
  for (int item = first_item; item < units; ++items_done) {
    begin_rows(begin_item(item));
    if (tracer) trace_event(params, 1 + consumer, items_done, kTraceConsumerBegin, item);
    int tile = first_tile;  // the key tile of iteration i
    if constexpr (!Traits::overlap_softmax) {
      for (int i = 0; i < tile_count; ++i, tile = next_tile(tile)) {
        wait_full(i, tile);
        if (tracer && i == 0) trace_event(params, 1 + consumer, items_done, kTraceConsumerFirstTile, item);
        begin_turn();
        wgmma_fence();
        issue_scores(score, i);
        end_turn();
        wgmma_wait_group<0>();
        fence_registers(score);
        if constexpr (Traits::kv_split) release(i);  // K read: the producer may load K (i + 1) over it
        if (softmax(score, tile, correction)) rescale(correction);
        if (tracer && i == 0) trace_event(params, 1 + consumer, items_done, kTraceConsumerFirstSoftmax, item);
        pack(score, p);
        if (i == tile_count - 1) release_q();
        if constexpr (Traits::kv_split) wait_values(i, tile);  // before the turn: the other may go on
        begin_turn();
        wgmma_fence();
        issue_pv(p, i);
        end_turn();
        wgmma_wait_group<0>();
        fence_registers(output);
        if constexpr (Traits::kv_split) {
          release_values(i);
        } else {
          release(i);  // this thread is done reading the stage
        }
      }
    } else {
      // Tile 0's scores alone; then per tile i: S(i) and P(i-1) V(i-1) queued together, softmax(i) while
      // P V runs, and only then O's rescale by tile i's correction; P(i) waits for the next iteration.
      // The rescale (when a max moved) runs after S(i) is issued, under it, and before P V (i - 1).
      //
      // The wait for P V sits at the head of the next iteration, not after the softmax in the same one:
      // ptxas schedules a wgmma.wait_group as early as its basic block allows, and with the wait after the
      // softmax in one block it put the wait ahead of the whole softmax (no report in its log; the SASS of
      // every D 128 specialization until session 29 had its first MUFU.EX2 after
      // `WARPGROUP.DEPBAR.LE gsb0, 0x0`), so the softmax ran after P V instead of under it. ptxas does not
      // move the wait across the loop's back edge. The wait is unconditional, so both edges into the loop
      // head agree on what is in flight after it (nothing), which keeps ptxas from serializing the wgmmas
      // (a conditional wait there did). Checked by test_gpu "[sass]"; attention-notes.md, "Session 29".
      wait_full(0, tile);
      if (tracer) trace_event(params, 1 + consumer, items_done, kTraceConsumerFirstTile, item);
      stagger_first();
      begin_turn();
      wgmma_fence();
      issue_scores(score, 0);
      end_turn();
      if (kStaggered && consumer == 1) named_barrier_arrive(7);  // the stagger: warpgroup 1 issued its S(0)
      wgmma_wait_group<0>();
      fence_registers(score);
      // O is still zero: its rescale by this correction keeps it zero.
      bool moved = softmax(score, tile, correction);
      if (tracer) trace_event(params, 1 + consumer, items_done, kTraceConsumerFirstSoftmax, item);
      if (kStaggered && consumer == 0) named_barrier_arrive(6);  // the stagger: warpgroup 0's first softmax
      for (int i = 1; i < tile_count; ++i) {
        wgmma_wait_group<0>();  // P V (i - 2) has completed (at i = 1 nothing is in flight)
        fence_registers(output);
        if (i > 1) release(i - 2);
        pack(score, p);
        tile = next_tile(tile);
        wait_full(i, tile);
        begin_turn();
        wgmma_fence();
        issue_scores(score, i);
        fence_registers(output);  // keeps the rescale after S(i)'s issue
        if (moved) rescale(correction);
        wgmma_fence();  // O's registers written: fence before P V reads them as its accumulator
        issue_pv(p, i - 1);
        end_turn();
        wgmma_wait_group<1>();  // S(i) has landed; P V (i - 1) may still run
        fence_registers(score);
        moved = softmax(score, tile, correction);
      }
      wgmma_wait_group<0>();
      fence_registers(output);
      if (tile_count > 1) release(tile_count - 2);
      if (moved) rescale(correction);
      pack(score, p);
      release_q();
      begin_turn();
      wgmma_fence();
      issue_pv(p, tile_count - 1);
      end_turn();
      wgmma_wait_group<0>();
      fence_registers(output);
      release(tile_count - 1);
    }
    if (tracer) trace_event(params, 1 + consumer, items_done, kTraceConsumerLastProduct, item);

    // ---- epilogue: normalize and store bf16 pairs ------------------------------------------------------
    // output: [num_tokens, query_heads * head_dim], rows output_row_stride apart. The item's place is
    // looked up again rather than kept through the loop in registers the consumers do not have.
    // A split item's rows are stored by its last part, once merged.
    bool stores = true;
    if constexpr (Traits::splits_tail) stores = item < whole_items || merge_parts(locate(item));
    const Place place = locate(item);
    const int out_rows = min(kTokens, place.query_len - place.row_begin);
#pragma unroll
    for (int half = 0; half < 2 && stores; ++half) {
      const float total = quad_sum(row_sum[half]);
      // fp8: P V was computed against the codes; v_scale restores the values.
      const float inverse = total > 0.0f ? (Traits::kv_fp8 ? params.v_scale : 1.0f) / total : 0.0f;
      const int row = warp_row + group + 8 * half;
      const bool stored = row < Traits::used_rows && row / kHeads < out_rows;
      const long long token = place.query_start + place.row_begin + row / kHeads;
      const int head = place.first_head + row % kHeads;
      bf16_bits* const destination = params.output + token * params.output_row_stride + head * kHeadDim;
      // 16 bytes a lane (quad_transpose), not 4: a warp's store touches the same 8 rows either way, and its
      // 4 x fewer store instructions were the cost (the 4-byte stores took 4-10% of the one-sequence rows,
      // attention-notes.md "Session 42"). Every lane shuffles; only the rows of the chunk store.
#pragma unroll
      for (int k = 0; k < kHeadDim / 32; ++k) {
        unsigned words[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * k + i;  // n8 tile j: columns 8 j + 2 in_group, + 1
          words[i] = pack_bf16(output[4 * j + 2 * half] * inverse, output[4 * j + 2 * half + 1] * inverse);
        }
        quad_transpose(words, in_group);
        if (stored) store_global_16(destination + 8 * (4 * k + in_group), words);
      }
    }
    if (tracer) trace_event(params, 1 + consumer, items_done, kTraceConsumerStored, item);
    base += tile_count;
    mbarrier_wait_parity(item_barriers + band * 8, items_done & 1);
    if (tracer) trace_event(params, 1 + consumer, items_done, kTraceConsumerNext, item);
    item = *consumer_slot(band);
  }
  if (tracer) trace_end(params, 1 + consumer, items_done);
  end_turns();
  end_stagger();
#else
  // Not an sm_90a target: the plan never picks this kernel there (choose_attention_kernel).
  __trap();
#endif
}

}  // namespace attnplan::kernels
