// Parameter block of the variable-length paged attention kernel (spec section 6), shared by the host
// (C++20) and NVRTC. Builtin types only, like params.h.
#pragma once

#include "attnplan/params.h"
#include "attnplan/tensor_map.h"

namespace attnplan {

// Sequences that the sm_90a kernel's sequence-major walk can order (AttentionParams::seq_order).
inline constexpr int kAttentionOrderedSeqs = 128;

// Prefill attention over the paged KV cache. Sequence s owns query rows [query_starts[s], query_starts[s +
// 1]) at positions context_lens[s] + i; its keys are positions [0, context_lens[s] + n_s) read through its
// block table (the chunk's own k and v are already in the cache). Query head h reads kv head h / group_size,
// where group_size is a compile-time trait and query_heads == kv_heads * group_size.
//
// Alignment (checked by the host before launch): query, key_cache, value_cache and output 16-byte aligned;
// query_row_stride and output_row_stride multiples of 8 elements. Head dims are multiples of 8 (config rule).
struct AttentionParams {
  const bf16_bits* query;  // [num_tokens, query_heads, head_dim] at column 0 of rows query_row_stride apart
                           // (a fused QKV buffer: the q part leads each row)
  const bf16_bits* key_cache;    // [num_blocks, block_size, kv_heads, head_dim]
  const bf16_bits* value_cache;  // [num_blocks, block_size, kv_heads, value_head_dim]
  bf16_bits* output;             // [num_tokens, query_heads * value_head_dim], rows output_row_stride apart
  const int* query_starts;       // [num_seqs + 1], non-decreasing, query_starts[0] == 0
  const int* context_lens;       // [num_seqs]
  const int* block_tables;       // [num_seqs, max_blocks_per_seq]
  const int* span_offsets;       // [num_seqs + 1] CSR into span_bounds; read only when the traits have spans
  const int* span_bounds;  // [num_spans, 2] {start, end} absolute positions, sorted and disjoint per sequence
  const float* sinks;      // [query_heads] sink logits (natural log units, unscaled); only with sinks
  // The sm_90a kernel (AttentionSpec::dynamic_items; null for the mma.sync one):
  // a counter that must be 0 when the launch starts (execute's KV store kernel zeroes it: KvStoreParams),
  // from which the CTAs claim their work items after their first one (atomicAdd), so a CTA that ends an
  // item early takes the heaviest one left.
  int* item_counter;
  // The sm_90a kernel's walk over its work items (plan::longest_first_sequences). ordered_seqs 0: tile-major
  // over every sequence (query tiles counted down from max_query_len, then sequence, then head group: the
  // heaviest first under a causal mask). ordered_seqs == num_seqs: sequence-major over seq_order[0,
  // num_seqs), every sequence once, then head group, then query tile from the last: the walk the host picks
  // when every chunk is one bidirectional span, where an item costs its sequence's length whatever its query
  // tile. Passed by value, so a graph that captured the launch keeps its batch's order, as it keeps num_seqs.
  int ordered_seqs;
  unsigned short seq_order[kAttentionOrderedSeqs];
  // 1 when every chunk with tokens is one span over exactly itself, [context_len, context_len + chunk_len)
  // (plan::every_chunk_one_span: non-causal prompts), so that each of its rows sees all of its sequence's
  // keys: the sm_90a kernel then takes an item's key tiles and its rows' span from context_lens and
  // query_starts alone and reads neither span array, whose walk at each item's start cost ~1.5 us per item
  // with the tensor cores idle (attention-notes.md, "Session 48"). 0: it walks the spans. Read only by a
  // kernel with spans; passed by value, so a captured graph replays its batch's choice (embedding.md).
  int whole_chunk_spans;
  // The sm_90a kernel's split tail (plan::split_tail_items; split_items 0: none; read only by its
  // splits_tail specialization, the plan's attention_split). When the items do not fill the last round of
  // the persistent grid, the last split_items items are each split over their key tiles into
  // min(split_parts, the item's tiles) parts, claimed like items, so the last round's CTAs share that work
  // rather than most of them idling. A part leaves its unnormalized O and row statistics
  // in split_partials (attention_sm90_split_unit_floats each, at part slot * split_parts + part, slot =
  // item - (items - split_items)); the part that finishes last (split_counters[slot], one int per split
  // item, 0 when the launch starts: execute's KV store kernel zeroes them with item_counter) merges the
  // others' into its own and stores the rows.
  float* split_partials;
  int* split_counters;
  int split_items;
  int split_parts;
  // The sm_90a kernel's trace (AttentionSpec::traces; read only by that specialization, which the plan
  // has only when asked: `attnplan bench --trace-attention`): kAttentionTraceCtas x kAttentionTraceRoles
  // slots of kAttentionTraceRecords records, laid out as the comment above kAttentionTraceCtas says.
  unsigned long long* trace;

  long long query_row_stride;   // elements between consecutive query rows
  long long output_row_stride;  // elements between consecutive output rows
  float scale;                  // multiplies q . k (spec default 1 / sqrt(head_dim))
  float softcap;                // c in c * tanh(score / c); only with softcap, must be > 0
  int window;                   // W: keys pk > pq - W are visible (W >= 1); only with a window
  int num_seqs;
  int max_query_len;  // host-side bound on query_starts[s + 1] - query_starts[s]; sizes grid.x
  int kv_heads;
  int max_blocks_per_seq;
  int num_blocks;  // pages in the pool; a page outside [0, num_blocks) is never read (its keys read as zeros)
  // fp8 KV cache only (a compile-time trait): key_cache and value_cache then hold 1-byte e4m3fn codes in
  // the same [num_blocks, block_size, kv_heads, dim] layout, read as k = k_q * k_scale, v = v_q * v_scale.
  float k_scale;
  float v_scale;
};

// Whether the sm_90a kernel's TMA K/V path is TMA only (attention_sm90.cuh, kv_tma): at D 256 the
// producer's registers do not hold the gather beside it, so the tile that reaches past the keys comes by
// TMA too and its V rows past kv_len are zeroed in shared memory (one more mbarrier: the boxes land there
// before the producer zeroes and arrives on the stage's full barrier). At D <= 128 that tile is gathered.
ATTNPLAN_HOST_DEVICE constexpr bool attention_sm90_kv_tma_only(int head_dim, bool kv_tma) {
  return kv_tma && head_dim > 128;
}

// Whether the sm_90a kernel gives K and V their own full and empty mbarriers (attention_sm90.cuh,
// kv_split): TMA only, 128-key tiles. One K buffer and one V buffer of 128 keys then take the shared memory
// of two 64-key stages, and K(i + 1) loads as soon as both consumer warpgroups' S(i) have read K(i), V(i + 1)
// once their P V(i) have read V(i), so a single buffer of each still overlaps its load with the other's
// products (attention-notes.md, "Session 50").
ATTNPLAN_HOST_DEVICE constexpr bool attention_sm90_kv_split(int head_dim, int block_n, bool kv_tma) {
  return attention_sm90_kv_tma_only(head_dim, kv_tma) && block_n == 128;
}

// Bands of Q in the sm_90a kernel (attention_sm90.cuh, q_bands): with two consumer warpgroups (128 query
// rows: D 128 and D 256) each warpgroup's 64 rows are a band with its own empty and full mbarrier, so the
// producer copies one warpgroup's next Q as soon as that one has read its own; with three (D 64's 192
// rows) Q is one band that rides the item's first K/V tile, as three bands measured 6% slower at D 64
// (attention-notes.md, "Session 47").
ATTNPLAN_HOST_DEVICE constexpr int attention_sm90_q_bands(int block_m) {
  return block_m == 128 ? 2 : 1;
}

// Dynamic shared memory of the sm_90a kernel (attention_sm90.cuh), bytes: 1024 of alignment slack, Q
// [block_m, D], `stages` stages of K and V [block_n, D] bf16, with an fp8 cache two staging buffers of K and
// V codes [block_n, D], two mbarriers per stage (four with kv_split: K's and V's full and empty), an empty
// mbarrier per band of Q and, with two bands, a
// full one each, TMA only the landing mbarrier, then the item schedule's: per band an mbarrier and a slot
// (8 bytes each), and the producers' two slots (8 bytes). One formula for the traits and the host.
ATTNPLAN_HOST_DEVICE constexpr int attention_sm90_shared_bytes(int head_dim, int block_n, int stages,
                                                               bool kv_fp8, bool kv_tma = false,
                                                               int block_m = 128) {
  const int bands = attention_sm90_q_bands(block_m);
  return 1024 + 2 * head_dim * (block_m + stages * 2 * block_n) + (kv_fp8 ? 2 * 2 * block_n * head_dim : 0) +
         (attention_sm90_kv_split(head_dim, block_n, kv_tma) ? 4 : 2) * stages * 8 + 8 * bands +
         (bands > 1 ? 8 * bands : 0) + (attention_sm90_kv_tma_only(head_dim, kv_tma) ? 8 : 0) + 16 * bands +
         8;
}

// Whether the sm_90a kernel can split its tail items (AttentionParams::split_items), in its specialization
// with splits_tail (AttentionSm90Traits; the others ignore split_items): every head dim it takes. D 256
// joined in session 53, once the merge read the other parts' O a few vectors at a time (before, all of a
// part's O beside this one's spilled 8-40 bytes in 13 of the ptxas test's 22 D 256 split specializations;
// attention-notes.md "Session 52").
ATTNPLAN_HOST_DEVICE constexpr bool attention_sm90_splits(int head_dim) {
  return head_dim <= 256;
}
// The most parts a split item is cut into (the merge reads the others' partials one after another).
inline constexpr int kAttentionMaxSplitParts = 4;

// Floats of one split part's partial in AttentionParams::split_partials: per consumer thread (128 per 64
// rows of block_m) its O accumulators (head_dim / 2) and its rows' two maxima and two partial sums.
ATTNPLAN_HOST_DEVICE constexpr long long attention_sm90_split_unit_floats(int head_dim, int block_m) {
  return static_cast<long long>(2 * block_m) * (head_dim / 2 + 4);
}

// Threads of the sm_90a kernel's CTA: a producer warpgroup and one consumer warpgroup per 64 query rows
// (block_m 128: 384, block_m 192: 512).
ATTNPLAN_HOST_DEVICE constexpr int attention_sm90_threads(int block_m) {
  return 128 + 128 * (block_m / 64);
}

// TMA boxes per K/V tile of the sm_90a kernel with kv_tma: [64 columns, min(block_size, block_n) slots]
// boxes, head_dim / 64 column blocks, for K and V. The kernel issues one per producer lane (at most 32),
// with kv_split a K box and then a V box per lane (at most 32 of each).
ATTNPLAN_HOST_DEVICE constexpr int attention_sm90_kv_tma_boxes(int head_dim, int block_size, int block_n) {
  return 2 * (block_n / (block_size < block_n ? block_size : block_n)) * (head_dim / 64);
}
ATTNPLAN_HOST_DEVICE constexpr int attention_sm90_kv_tma_box_lanes(int head_dim, int block_size, int block_n,
                                                                   bool kv_tma) {
  const int boxes = attention_sm90_kv_tma_boxes(head_dim, block_size, block_n);
  return attention_sm90_kv_split(head_dim, block_n, kv_tma) ? boxes / 2 : boxes;
}

// The sm_90a kernel's trace (AttentionSpec::traces): one lane of each warpgroup (the producer's thread 0,
// each consumer warpgroup's first) reads %clock64 at fixed points of every work unit and writes a record
// to its own slot, CTA-major: slot (blockIdx.x * kAttentionTraceRoles + role), role 0 the producer and
// 1 + w consumer warpgroup w. A slot is kAttentionTraceRecords records of two 64-bit words:
//   record 0: {%clock64, %globaltimer} when the warpgroup starts its first unit;
//   record 1: {%clock64, %globaltimer} when it has ended its last (the pair gives the SM's clock rate);
//   record 2: {%smid, units walked};
//   record 3 + kAttentionTraceEventsPerUnit * n + e: {%clock64, unit} of event e of the n-th unit it
//   walked (AttentionTraceEvent; a unit past the slot's capacity is counted, not recorded).
// A slot whose record 2 reads zero units was not used (the host zeroes the buffer before a traced launch).
// The persistent grid has at most one CTA per SM: kAttentionTraceCtas covers the sm_90 parts (132 on an
// H100 / H200 SXM, 148 on a B200).
inline constexpr int kAttentionTraceCtas = 160;
inline constexpr int kAttentionTraceRoles = 4;  // the producer and up to three consumer warpgroups
inline constexpr int kAttentionTraceRecords = 512;
inline constexpr int kAttentionTraceHeaderRecords = 3;
inline constexpr int kAttentionTraceEventsPerUnit = 6;

// Events of a work unit, in the order each role reaches them (the index e of its record).
enum AttentionTraceEvent {
  // The producer (role 0):
  kTraceProducerBegin = 0,       // the unit's place and tile schedule known (begin_item)
  kTraceProducerFirstTile = 1,   // its first K/V tile's copies issued (and arrived on the full barrier)
  kTraceProducerQ = 2,           // its Q copies issued (after waiting for Q's buffer to be free)
  kTraceProducerLastTile = 3,    // its last K/V tile's copies issued
  kTraceProducerClaimed = 4,     // the next unit claimed and shared among the producer's threads
  kTraceProducerPrefetched = 5,  // the next unit's Q prefetched into L2 (TMA K/V only; else as 4)
  // A consumer warpgroup (roles 1 to 3):
  kTraceConsumerBegin = 0,         // the unit's rows set up (begin_rows)
  kTraceConsumerFirstTile = 1,     // the first K/V tile and Q have landed (its full barrier passed)
  kTraceConsumerFirstSoftmax = 2,  // the first tile's softmax done
  kTraceConsumerLastProduct = 3,   // the last P V has completed
  kTraceConsumerStored = 4,        // the normalized rows' stores issued
  kTraceConsumerNext = 5,          // the next unit handed over (its item barrier passed)
};

// Bytes of the trace buffer (AttentionParams::trace).
inline constexpr long long kAttentionTraceBytes =
    16LL * kAttentionTraceCtas * kAttentionTraceRoles * kAttentionTraceRecords;
// Units a slot records: the records after the header, a unit's events each.
inline constexpr int kAttentionTraceRecordedUnits =
    (kAttentionTraceRecords - kAttentionTraceHeaderRecords) / kAttentionTraceEventsPerUnit;

// Where the kernel writes and the host reads: the first 64-bit word of CTA `cta`'s slot for warpgroup
// `role`, and the record of event `event` of the `walked`-th unit (from 0) a warpgroup walked.
ATTNPLAN_HOST_DEVICE constexpr long long attention_trace_slot_word(int cta, int role) {
  return 2LL * kAttentionTraceRecords * (static_cast<long long>(cta) * kAttentionTraceRoles + role);
}
ATTNPLAN_HOST_DEVICE constexpr int attention_trace_event_record(int walked, int event) {
  return kAttentionTraceHeaderRecords + kAttentionTraceEventsPerUnit * walked + event;
}

// The sm_90a kernel's parameters when it loads K/V pages with TMA (AttentionSm90Traits::kv_tma): the
// common block plus one tensor map per cache, encoded by the host per launch (plan::launch_attention). Each
// map sees its cache as a matrix [num_blocks * block_size slots, kv_heads * head_dim] bf16 and moves boxes
// of 64 columns x min(block_size, block_n) slots with the 128-byte swizzle the wgmma operands use. Passed
// as a `__grid_constant__` kernel parameter, so the maps stay in parameter memory where TMA reads them.
struct AttentionSm90Params {
  TensorMap key_map;
  TensorMap value_map;
  AttentionParams common;
};

}  // namespace attnplan
