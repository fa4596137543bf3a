// The variable-length paged attention kernel (spec section 6; templates/attnplan/attention.cuh): its
// pure tile heuristic, its typed kernel spec, and the host-side checks of its Params.
#pragma once

#include <span>
#include <vector>

#include "attnplan/attention_params.h"
#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "config/target.hpp"
#include "driver/launch.hpp"

namespace attnplan::plan {

// Head dims the attention kernel supports: multiples of 8 in [16, 256] for both q/k and v. A warp keeps
// 16 rows of the fp32 output tile in registers (value_head_dim / 2 per thread), so wider value heads would
// spill; config-valid dims above 256 are rejected by choose_attention_tiling.
inline constexpr int kMaxAttentionHeadDim = 256;

// One CTA's work: block_m query rows (16 per warp) against key tiles of block_n keys, `stages` K/V
// tiles in shared memory.
struct AttentionTiling {
  int block_m = 128;
  int block_n = 64;
  int stages = 2;
  // CTAs per SM the kernel's __launch_bounds__ promises: 1 lets ptxas use up to 255 registers per thread,
  // 2 caps 8-warp CTAs at 128 (more warps resident, but spills wherever the tile needs more).
  int min_blocks_per_sm = 1;
  int shared_bytes = 0;  // dynamic shared memory per CTA for this tiling (attention_shared_bytes)
  // sm_90a kernel only: query heads of one kv head packed into a CTA's block_m rows (GQA packing), so a
  // CTA covers block_m / heads_per_cta tokens. 1 for the mma.sync kernel.
  int heads_per_cta = 1;
  // sm_90a kernel only: the consumers' schedule (AttentionSm90Traits::overlap_softmax): false runs S,
  // softmax and P V of a tile in series; true overlaps softmax(i) with P(i-1) V(i-1) (needs stages >= 3).
  bool overlap_softmax = false;
  // sm_90a kernel only: the two consumer warpgroups take turns issuing wgmmas
  // (AttentionSm90Traits::ping_pong).
  bool ping_pong = false;
  // sm_90a kernel only: K/V pages by TMA instead of the cp.async gather (AttentionSm90Traits::kv_tma;
  // where sm90_kv_tma_supported). Launched with AttentionSm90Params (launch_attention).
  bool kv_tma = false;
  // sm_90a kernel only: a persistent grid, one CTA per SM walking the work items (query tile, sequence,
  // head group) heaviest first, instead of one CTA per item (AttentionSpec::launch_shape). The same cubin
  // either way: the launch decides.
  bool persistent = false;

  int warps() const { return block_m / 16; }
  int threads() const { return 32 * warps(); }
  friend bool operator==(const AttentionTiling&, const AttentionTiling&) = default;
};

// Pure. 128 query rows (8 warps) when both padded head dims are <= 128, else 64 (4 warps: the output
// accumulators of a warp grow with value_head_dim); 64-key tiles, or 32 (then 16) when the larger tile
// does not fit the arch's shared memory per CTA (256-wide heads on the 99 KiB parts). Throws Error(config)
// naming the dim for head dims the kernel does not support (see kMaxAttentionHeadDim) or a tiling that fits
// nowhere.
// With kv_fp8 (an fp8 e4m3fn cache) the shared-memory budget is attention_shared_bytes(..., kv_fp8 = true).
AttentionTiling choose_attention_tiling(int head_dim, int value_head_dim, config::Arch arch,
                                        bool kv_fp8 = false);

// Dynamic shared memory of the kernel, bytes: bf16 Q [block_m, D16 + 8] plus `stages` x (K [block_n, D16 + 8]
// and V [block_n, Dv16 + 8]), where D16 rounds up to 16; at least the output tile [block_m, Dv16 + 8].
// Mirrors AttentionTraits::shared_bytes. With kv_fp8 the K/V tiles arrive as 1-byte codes: `stages` x
// (K [block_n, D] and V [block_n, Dv]) bytes of staging, and one bf16 K/V tile they are widened into.
int attention_shared_bytes(int head_dim, int value_head_dim, int block_m, int block_n, int stages = 2,
                           bool kv_fp8 = false);

// The most dynamic shared memory one CTA may opt in to on a typical part of `arch` (sm_80/87: 163 KiB,
// sm_86/89/120: 99 KiB, sm_90/100: 227 KiB; unknown archs: 99 KiB).
int max_shared_bytes_per_block(config::Arch arch);

// Which kernel template serves the attention stage: the mma.sync kernel (attention.cuh, every arch and
// feature) or the sm_90a warp-specialized wgmma kernel (attention_sm90.cuh, a subset of the features).
enum class AttentionKernel { mma_sync, wgmma_sm90 };

const char* to_string(AttentionKernel kernel);

// Pure. The wgmma kernel when the arch is sm_90a (arch-specific features: wgmma, setmaxnreg) and
// head_dim == value_head_dim in {64, 128, 256}, with an fp8 cache only up to D 128 (its staging buffers do
// not fit beside two bf16 stages at D 256); causal, sliding window, spans, sinks, a softcap, GQA/MQA and
// every page size on both. Otherwise the mma.sync kernel.
AttentionKernel choose_attention_kernel(int head_dim, int value_head_dim, bool bf16_kv_cache,
                                        config::Arch arch);

// Pure. Whether the sm_90a kernel loads K/V with TMA (AttentionSm90Traits::kv_tma): pages of at least 8
// slots and at most 32 boxes of [64 columns, min(block_size, block_n) slots] per K and V tile together (one
// per lane of the issuing warp): block_size >= 8 at D 64, >= 16 at D 128 and 256. D 256 takes the TMA-only
// producer (attention_sm90_kv_tma_only), where the tile past the keys lands on its own mbarrier.
bool sm90_kv_tma_supported(int head_dim, int block_size, int block_n);

// Pure. Whether a TMA plan's sm_90a kernel takes 128-key tiles with K and V each in one buffer on its own
// mbarriers (attention_sm90_kv_split, one stage): D 256 where its 32 K boxes and 32 V boxes fit the lanes
// (pages of at least 16), without a softcap. With one the split compiles without spills since session 51
// (the softcap's c log2(e) joined the softmax's FFMA; before, ptxas spilled 120-176 bytes beside S
// [64, 128] and O [64, 256] in the consumers' 232 registers) and passes the GPU test, but measured against
// 64-key tiles at D 256 with softcap 50 (H100, session 52) it was mixed: bidirectional 4k -4%, 4 x 16k -1%,
// causal 4k +2%, causal 1k +4%. So the plan keeps 64-key tiles there (attention-notes.md, "Session 52").
bool choose_sm90_kv_split(int head_dim, int block_size, bool has_softcap);

// Pure. `tiling` (an sm_90a tiling, choose_sm90_attention_tiling's) with K/V by TMA, as a plan whose pages
// allow it (sm90_kv_tma_supported, bf16 cache) takes it: kv_tma, at D 256 the split's 128-key tiles of one
// stage where choose_sm90_kv_split says so, and the shared bytes of the result. One rule for the plan
// (AttentionSpec::from_config) and for the GPU tests that force TMA.
AttentionTiling with_sm90_kv_tma(AttentionTiling tiling, int head_dim, int block_size, bool has_softcap);

// Dynamic shared memory of the sm_90a kernel, bytes: 1024 of alignment slack, Q [block_m, D], `stages`
// stages of K and V [block_n, D], bf16, with an fp8 cache two staging buffers of K and V codes [block_n, D],
// two mbarriers per stage and Q's (and the landing mbarrier of the TMA-only path), and the item schedule's
// mbarrier and slots: attention_params.h's attention_sm90_shared_bytes, which the traits check their
// layout against.
int sm90_attention_shared_bytes(int head_dim, int block_n, int stages, bool kv_fp8 = false,
                                bool kv_tma = false, int block_m = 128);

// Pure. The sm_90a kernel's tile per head dim: 128 query rows (two consumer warpgroups of 64) at D 128
// and 256, 192 (three) at D 64, where one warpgroup's softmax outlasts another's two matrix products
// (attention-notes.md, session 12); key tiles of 128 for D <= 128 and 64 for D = 256 (O [64, 256] fp32 is
// 128 registers per consumer thread; a 64-key S keeps the rest under the 224 the consumers get); three
// stages where they fit sm_90's 227 KiB (D 64 and 128), else two (D 256; D 128 with an fp8 cache); the
// overlapped softmax schedule with three stages and two consumers (three consumers' 152 registers hold
// only the serial one); ping-pong with two consumer warpgroups (the fastest schedule there on the H200:
// docs/attention-notes.md, v3), none with three (session 12); heads_per_cta the
// largest divisor of group_size up to 16 (each K/V tile then serves that many query heads; at least 8 tokens
// per CTA keep the causal band's waste small); a persistent grid. Throws Error(config) for other head dims or
// group_size < 1.
AttentionTiling choose_sm90_attention_tiling(int head_dim, int group_size, bool kv_fp8 = false);

struct AttentionSpec {
  AttentionKernel kernel = AttentionKernel::mma_sync;
  int head_dim = 0;
  int value_head_dim = 0;
  int group_size = 1;  // query heads per kv head (query_heads / kv_heads)
  int block_size = 0;  // tokens per cache page (a power of two)
  bool has_softcap = false;
  bool has_window = false;
  bool has_spans = false;
  bool has_sinks = false;
  // kv_cache.dtype fp8_e4m3: the cache holds 1-byte e4m3fn codes; the kernel widens K/V tiles to bf16 in
  // shared memory and applies params.k_scale to the scores, params.v_scale to the output.
  bool kv_fp8 = false;
  // The sm_90a kernel's split tail compiled in (AttentionSm90Traits::splits_tail): only
  // this specialization reads AttentionParams::split_items. The plan has it beside the planned kernel as
  // KernelPlan::attention_split, which the launches that split take (choose_tail_split); the others run
  // without the merge's code (5% at D 128, 1k tokens bidirectional: attention-notes.md, "Session 46").
  bool splits_tail = false;
  // The sm_90a kernel's trace compiled in (AttentionSm90Traits::traces, attention_params.h's
  // AttentionTraceEvent): each warpgroup records the clock at fixed points of every work unit into
  // AttentionParams::trace. Planned only when asked (PlanOptions::trace_attention: `attnplan bench
  // --trace-attention`), as its own specialization; see docs/attention-trace.md.
  bool traces = false;
  AttentionTiling tiling;

  // The config's shapes and feature flags, choose_attention_kernel and that kernel's tiling
  // (choose_sm90_attention_tiling or choose_attention_tiling(head_dim, value_head_dim, arch)).
  static AttentionSpec from_config(const config::AttentionConfig& config, config::Arch arch);

  compiler::KernelSource source() const;
  friend bool operator==(const AttentionSpec&, const AttentionSpec&) = default;

  int threads() const {
    return kernel == AttentionKernel::wgmma_sm90 ? attention_sm90_threads(tiling.block_m) : tiling.threads();
  }
  // What each launch needs and what driver::Function::set_max_dynamic_shared_bytes must allow at load
  // (above 48 KiB for every tiling the heuristic picks).
  int dynamic_shared_bytes() const;
  // block [threads], dynamic_shared_bytes. mma.sync: grid [ceil(max_query_len / block_m), num_seqs,
  // query_heads]. sm_90a: a 1-D grid over the work items, ceil(max_query_len / tokens per CTA) x num_seqs x
  // query_heads / heads_per_cta (tokens per CTA = block_m / heads_per_cta): one CTA per item, or with
  // tiling.persistent and multiprocessors > 0 (the device's SMs; one CTA fits an SM) at most that many.
  // Throws Error(input) unless max_query_len, num_seqs, query_heads > 0, num_seqs, query_heads <= 65535
  // and there are at most 2^30 items.
  driver::LaunchShape launch_shape(int num_seqs, int max_query_len, int query_heads,
                                   int multiprocessors = 0) const;
  // Whether the kernel claims its work items from AttentionParams::item_counter, which its launches must
  // set: the sm_90a kernel, whose CTAs share the items greedily (attention_sm90.cuh). mma.sync launches a
  // CTA per item.
  bool dynamic_items() const { return kernel == AttentionKernel::wgmma_sm90; }

  // Throws Error(input) naming the field when `params` breaks what the kernel assumes and the host can see
  // without reading device memory: null or non-16-byte-aligned query, caches or output; row strides not
  // multiples of 8 or narrower than query_heads * head_dim (query) / query_heads * value_head_dim (output);
  // null batch arrays; num_seqs, max_query_len, kv_heads, max_blocks_per_seq, num_blocks not positive or
  // num_blocks * block_size slots beyond 2^31 - 1 (slots are 32-bit in the kernel);
  // window < 1 or softcap <= 0 (when the spec has them); null span_offsets or sinks when the spec has them;
  // k_scale or v_scale not finite and > 0 (kv_fp8); ordered_seqs neither 0 nor num_seqs (at most
  // kAttentionOrderedSeqs), not 0 for the mma.sync kernel, or seq_order not listing every sequence once;
  // whole_chunk_spans neither 0 nor 1, or 1 without spans on the sm_90a kernel; a split tail (split_items >
  // 0) on a kernel without splits_tail, with split_parts outside [2, kAttentionMaxSplitParts], more split
  // items than work items or more parts than kMaxTailSplitUnits, or null split_partials / split_counters; a
  // null trace for a spec that traces.
  void check(const AttentionParams& params, int query_heads) const;
};

// Whether every chunk with tokens is one span over exactly itself, [context_len, context_len + chunk_len)
// (AttentionParams::whole_chunk_spans), from the batch's host arrays (BatchDescription's host_*; span
// arrays empty: no spans, false). Its other spans, if any, lie in the cached prefix, whose keys every row
// of the chunk sees anyway. Pure.
bool every_chunk_one_span(std::span<const int> query_starts, std::span<const int> context_lens,
                          std::span<const int> span_offsets, std::span<const int> span_bounds);

// The order in which the sm_90a kernel walks a batch's work items (AttentionParams::seq_order), from the
// batch's host arrays (BatchDescription's host_*; span arrays empty: no spans). When every chunk with
// tokens is one bidirectional span ([context_len, context_len + chunk_len): spans cannot straddle the
// cached prefix, so no other span holds a whole chunk), each of its items sees all of its sequence's keys
// whatever its query tile: an item costs its sequence's length, the heaviest-first order the claims want
// is the longest sequence's items first, and within a sequence the kernel is free to take one kv head's
// query tiles after another, so the CTAs running at once share their keys. Returns every sequence, by
// decreasing keys (context_len + chunk_len; ties by index; chunks without tokens last: their items are
// passed over), for the kernel's sequence-major walk: the order is a hint the kernel's coverage does not
// depend on, so a graph replayed over other lengths is at worst slower. Empty, the tile-major walk,
// otherwise (a causal item's cost grows with its query tile, which that walk counts down) and for more
// than kAttentionOrderedSeqs sequences. Pure.
std::vector<int> longest_first_sequences(std::span<const int> query_starts, std::span<const int> context_lens,
                                         std::span<const int> span_offsets, std::span<const int> span_bounds);

// The sm_90a kernel's split tail (AttentionParams::split_items, split_parts): the last `items` work items
// are each cut into `parts` ranges of their key tiles. {0, 0}: none.
struct TailSplit {
  int items = 0;
  int parts = 0;
  friend bool operator==(const TailSplit&, const TailSplit&) = default;
};

// Parts a launch's split tail may have in all: the workspace's partials (plan_workspace) hold this many,
// at least one CTA per SM of the sm_90 parts (132 on an H100 / H200 SXM, 148 on a B200).
inline constexpr int kMaxTailSplitUnits = 160;

// Pure. `items` work items of `tiles` key tiles each (the same cost: one bidirectional span a chunk, every
// sequence the same length) over a persistent grid of `ctas` CTAs: when the last round would be at most half
// full, its items are split into as many parts as fill the grid, at most kAttentionMaxSplitParts, at least
// two tiles a part and at most `max_units` parts in all; otherwise none. The last round's CTAs then share
// its work, for one more fixed cost a part (its start, the partial's write, the last part's merge), rather
// than most of them idling while the rest run whole items: D 64's 4k bidirectional row has 688 items on 132
// CTAs, 5.2 rounds run as 6 (attention-notes.md, "Session 44").
TailSplit split_tail_items(long long items, int ctas, int tiles, int max_units);

// Pure. The planned kernel's split-tail specialization (the same spec with splits_tail), where a launch may
// split: the sm_90a kernel with spans (choose_tail_split splits only prompts that are
// one bidirectional span each). Empty otherwise.
std::optional<AttentionSpec> split_tail_specialization(const AttentionSpec& planned);

// Pure. The planned kernel's short-launch specialization: the sm_90a kernel at D 64 on two consumer
// warpgroups (block_m 128, the overlapped schedule) where the plan has three (block_m 192), with a bf16 KV
// cache (traced when the planned kernel is, so `attnplan bench --trace-attention` traces the kernel a short
// launch runs). Three warpgroups are 7-15% faster on prompts of 4k tokens and more (many rounds of
// items), two are 3-32% faster on launches of one or two rounds (attention-notes.md, "Session 50",
// "Session 54" and "Session 55"). Empty otherwise.
std::optional<AttentionSpec> short_launch_specialization(const AttentionSpec& planned);

// Pure. Whether a launch of `planned` over a batch (its host array of chunk starts) takes its short-launch
// specialization: the short kernel's work items with rows (one per query tile of each chunk and head
// group) at most two rounds of the grid (`multiprocessors` CTAs) and no more rounds than the planned
// kernel's. An item of 128 rows on two warpgroups runs in 0.68-0.86 of the time of one of 192 rows on
// three (each warpgroup has more of the SM; the longer the item's keys, the lower: 0.68 for a 256-token
// chunk after 16384 cached tokens), so the short kernel wins where it takes as many rounds and loses where
// its more numerous items take one more: 1k tokens in four chunks of 102 to 410 (272 short items on 132
// SMs, a third round against the planned kernel's 192 in two) ran 11% slower, a 384-token gpt-oss prompt
// (192 short items in two rounds against 128 planned ones in one) 7% (attention-notes.md, "Session 54" and
// "Session 55"). A cached prefix only lengthens every item alike, so it does not enter the rule.
bool takes_short_launch(const AttentionSpec& planned, std::span<const int> query_starts, int query_heads,
                        int multiprocessors);

// The split for a launch of `spec` (a sm_90a kernel with splits_tail; none otherwise) over a batch, from its
// host arrays: split_tail_items when the kernel walks it sequence-major (`sequence_major`: a non-empty
// longest_first_sequences) and every chunk has the same length and context; otherwise none. `multiprocessors`
// as launch_shape's; `max_units`: the parts the workspace holds.
TailSplit choose_tail_split(const AttentionSpec& spec, std::span<const int> query_starts,
                            std::span<const int> context_lens, bool sequence_major, int query_heads,
                            int multiprocessors, int max_units);

// Writes `sequences` (longest_first_sequences: at most kAttentionOrderedSeqs) into params.seq_order and
// params.ordered_seqs; empty sets the tile-major walk.
void set_item_order(AttentionParams& params, std::span<const int> sequences);

// Launches the attention kernel of `spec` on `stream` over `params` (already checked): the sm_90a kernel
// with kv_tma gets AttentionSm90Params, its two tensor maps encoded here over the caches
// ([num_blocks * block_size slots, kv_heads * head_dim]); every other kernel the AttentionParams as they are.
// `multiprocessors`: the device's SMs, the sm_90a kernel's persistent grid (0: one CTA per work item).
// params.item_counter (set for spec.dynamic_items() only) must hold 0 when the kernel starts (execute's KV
// store kernel zeroes it); a launch in flight on another stream needs its own.
void launch_attention(const driver::Function& function, const AttentionSpec& spec,
                      const AttentionParams& params, int query_heads, CUstream stream,
                      int multiprocessors = 0);

}  // namespace attnplan::plan
