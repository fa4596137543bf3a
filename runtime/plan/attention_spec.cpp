#include "plan/attention_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bitset>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "plan/tensor_map.hpp"

namespace attnplan::plan {

namespace {

int round_up(int value, int multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

void require(bool condition, const std::string& message) {
  if (!condition) throw Error(Stage::input, "attention: " + message);
}

bool aligned(const void* pointer, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

std::string cxx_bool(bool value) {
  return value ? "true" : "false";
}

void require_supported_dim(const char* name, int dim) {
  if (dim % 8 != 0 || dim < 16 || dim > kMaxAttentionHeadDim) {
    throw Error(
        Stage::config,
        fmt::format("attention: {} = {} is not supported: the kernel needs a multiple of 8 in [16, {}] "
                    "(a warp holds 16 rows of the fp32 output tile in registers)",
                    name, dim, kMaxAttentionHeadDim));
  }
}

}  // namespace

int attention_shared_bytes(int head_dim, int value_head_dim, int block_m, int block_n, int stages,
                           bool kv_fp8) {
  // Rows padded to a multiple of 16 (the mma k-step) plus 8 elements (conflict-free ldmatrix).
  const int qk_row = round_up(head_dim, 16) + 8;
  const int v_row = round_up(value_head_dim, 16) + 8;
  const int bf16_tiles = kv_fp8 ? 1 : stages;  // fp8: the stages are byte staging, widened into one tile
  const int main_elements = block_m * qk_row + bf16_tiles * block_n * (qk_row + v_row);
  const int output_elements = block_m * v_row;
  const int slot_table_bytes = stages * block_n * 4;  // int cache slot per key row of each stage
  const int staging_bytes = kv_fp8 ? stages * block_n * (head_dim + value_head_dim) : 0;
  return slot_table_bytes + 2 * std::max(main_elements, output_elements) + staging_bytes;
}

int max_shared_bytes_per_block(config::Arch arch) {
  switch (arch.sm()) {
    case 80:
    case 87:
      return 163 * 1024;
    case 90:
    case 100:
    case 103:
      return 227 * 1024;
    default:  // sm_86, sm_89, sm_120 and anything unknown
      return 99 * 1024;
  }
}

AttentionTiling choose_attention_tiling(int head_dim, int value_head_dim, config::Arch arch, bool kv_fp8) {
  require_supported_dim("head_dim", head_dim);
  require_supported_dim("value_head_dim", value_head_dim);
  const int widest = std::max(round_up(head_dim, 16), round_up(value_head_dim, 16));
  const int limit = max_shared_bytes_per_block(arch);

  AttentionTiling tiling;
  // 8 warps share one K/V tile when a thread's accumulators stay small (Dv <= 128: 64 fp32 registers);
  // wider heads take 4 warps so registers per thread, not warps per CTA, bound the tile.
  tiling.block_m = widest <= 128 ? 128 : 64;
  // min_blocks_per_sm stays 1: every feature combination then compiles without spills. Measured on an H200
  // (2026-11-29, one 8192-token causal chunk, Hq 32, Hkv 8, D 128): 128 x 64 with 1 block 226 TFLOP/s,
  // 128 x 32 with 2 blocks (127 registers) 226, 128 x 32 with 1 block 188, 64 x 64 207.
  for (const int block_n : {64, 32, 16}) {
    tiling.block_n = block_n;
    tiling.shared_bytes =
        attention_shared_bytes(head_dim, value_head_dim, tiling.block_m, block_n, tiling.stages, kv_fp8);
    if (tiling.shared_bytes <= limit) return tiling;
  }
  throw Error(Stage::config,
              fmt::format("attention: no tiling for head_dim {} / value_head_dim {} fits the {} "
                          "bytes of shared memory per block of {}",
                          head_dim, value_head_dim, limit, arch.name()));
}

const char* to_string(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::mma_sync:
      return "mma_sync";
    case AttentionKernel::wgmma_sm90:
      return "wgmma_sm90";
  }
  return "unknown";
}

AttentionKernel choose_attention_kernel(int head_dim, int value_head_dim, bool bf16_kv_cache,
                                        config::Arch arch) {
  const bool hopper = arch.sm() == 90 && arch.arch_specific;  // wgmma and setmaxnreg need sm_90a
  const bool dims = head_dim == value_head_dim && (head_dim == 64 || head_dim == 128 || head_dim == 256);
  const bool cache = bf16_kv_cache || head_dim <= 128;
  return hopper && dims && cache ? AttentionKernel::wgmma_sm90 : AttentionKernel::mma_sync;
}

bool sm90_kv_tma_supported(int head_dim, int block_size, int block_n) {
  if (block_size < 8 || head_dim % 64 != 0 || head_dim > 256 || block_n <= 0) return false;
  return attention_sm90_kv_tma_box_lanes(head_dim, block_size, block_n, /*kv_tma=*/true) <= 32;
}

bool choose_sm90_kv_split(int head_dim, int block_size, bool has_softcap) {
  return attention_sm90_kv_tma_only(head_dim, true) && sm90_kv_tma_supported(head_dim, block_size, 128) &&
         !has_softcap;
}

AttentionTiling with_sm90_kv_tma(AttentionTiling tiling, int head_dim, int block_size, bool has_softcap) {
  tiling.kv_tma = true;
  // D 256: 128-key tiles, K and V each in one buffer on its own barriers (attention_sm90_kv_split), in the
  // shared memory of two 64-key stages; its softmax then hides under the other warpgroup's 1024-cycle
  // product rather than a 512-cycle one (attention-notes.md, "Session 50" and "Session 51").
  if (choose_sm90_kv_split(head_dim, block_size, has_softcap)) {
    tiling.block_n = 128;
    tiling.stages = 1;
  }
  // The TMA-only path (D 256) adds its landing barrier.
  tiling.shared_bytes = sm90_attention_shared_bytes(head_dim, tiling.block_n, tiling.stages, /*kv_fp8=*/false,
                                                    /*kv_tma=*/true, tiling.block_m);
  return tiling;
}

int sm90_attention_shared_bytes(int head_dim, int block_n, int stages, bool kv_fp8, bool kv_tma,
                                int block_m) {
  return attention_sm90_shared_bytes(head_dim, block_n, stages, kv_fp8, kv_tma, block_m);
}

AttentionTiling choose_sm90_attention_tiling(int head_dim, int group_size, bool kv_fp8) {
  if (group_size < 1) {
    throw Error(Stage::config, fmt::format("attention: group_size = {} must be positive", group_size));
  }
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    throw Error(Stage::config,
                fmt::format("attention: head_dim = {} is not supported by the sm_90a kernel (64, 128 or 256)",
                            head_dim));
  }
  AttentionTiling tiling;
  tiling.block_m = head_dim == 64 ? 192 : 128;
  tiling.block_n = head_dim <= 128 ? 128 : 64;
  const int shared_limit = max_shared_bytes_per_block(config::Arch{9, 0, true});  // the kernel is sm_90a only
  tiling.stages =
      sm90_attention_shared_bytes(head_dim, tiling.block_n, 3, kv_fp8, false, tiling.block_m) <= shared_limit
          ? 3
          : 2;
  tiling.overlap_softmax = tiling.stages >= 3 && tiling.block_m == 128;
  // Ping-pong pays with two consumer warpgroups on the serial schedule (attention-notes.md, v3): one's
  // softmax runs under the other's matrix products. With three the warpgroups stagger on their own and
  // the turns only add waits (D 64 16k: 2.59 ms with turns, 2.30 without, session 12). On the overlapped
  // schedule (D 128) each warpgroup's softmax runs under its own P V, and without turns the long causal
  // rows and the layer's attention ran 1-2% faster, the bidirectional row level (session 31).
  tiling.ping_pong = tiling.block_m == 128 && !tiling.overlap_softmax;
  // Each CTA of a one-per-item grid pays its start (barrier set-up, Q and the first K/V tile's latency)
  // and its end (the last P V, normalization, stores) with the tensor cores idle; a persistent CTA loads
  // the next item's Q and first tiles while it finishes the current one (attention-notes.md, session 9).
  tiling.persistent = true;
  tiling.min_blocks_per_sm = 1;
  tiling.shared_bytes =
      sm90_attention_shared_bytes(head_dim, tiling.block_n, tiling.stages, kv_fp8, false, tiling.block_m);
  tiling.heads_per_cta = 1;
  for (int heads = 2; heads <= std::min(group_size, 16); ++heads)
    if (group_size % heads == 0) tiling.heads_per_cta = heads;
  return tiling;
}

AttentionSpec AttentionSpec::from_config(const config::AttentionConfig& config, config::Arch arch) {
  AttentionSpec spec;
  spec.head_dim = config.head_dim;
  spec.value_head_dim = config.value_head_dim;
  spec.group_size = config.group_size();
  spec.block_size = config.kv_cache.block_size;
  spec.has_softcap = config.softcap.has_value();
  spec.has_window = config.sliding_window.has_value();
  spec.has_spans = config.bidirectional_spans;
  spec.has_sinks = config.sinks;
  spec.kv_fp8 = config.kv_cache.dtype == config::KvCacheDtype::fp8_e4m3;
  spec.kernel = choose_attention_kernel(spec.head_dim, spec.value_head_dim, !spec.kv_fp8, arch);
  spec.tiling = spec.kernel == AttentionKernel::wgmma_sm90
                    ? choose_sm90_attention_tiling(spec.head_dim, spec.group_size, spec.kv_fp8)
                    : choose_attention_tiling(spec.head_dim, spec.value_head_dim, arch, spec.kv_fp8);
  if (spec.kernel == AttentionKernel::wgmma_sm90) {
    if (!spec.kv_fp8 && sm90_kv_tma_supported(spec.head_dim, spec.block_size, spec.tiling.block_n))
      spec.tiling = with_sm90_kv_tma(spec.tiling, spec.head_dim, spec.block_size, spec.has_softcap);
  }
  return spec;
}

compiler::KernelSource AttentionSpec::source() const {
  const bool sm90 = kernel == AttentionKernel::wgmma_sm90;
  if (sm90 && (value_head_dim != head_dim || (kv_fp8 && head_dim > 128))) {
    throw Error(
        Stage::config,
        "attention: the sm_90a kernel needs value_head_dim == head_dim, and head_dim <= 128 with an fp8 "
        "KV cache");
  }
  if (sm90 && tiling.block_m != 128 &&
      !(tiling.block_m == 192 && head_dim == 64 && !tiling.overlap_softmax)) {
    throw Error(Stage::config,
                fmt::format("attention: the sm_90a kernel's block_m is 128 (two consumer warpgroups) or, at "
                            "head_dim 64 with the serial schedule, 192 (three); got block_m {}, head_dim {}",
                            tiling.block_m, head_dim));
  }
  if (splits_tail && !(sm90 && attention_sm90_splits(head_dim))) {
    throw Error(
        Stage::config,
        fmt::format("attention: a split tail (splits_tail) needs the sm_90a kernel and head_dim <= 256; "
                    "got head_dim {} on {}",
                    head_dim, to_string(kernel)));
  }
  if (traces && !(sm90 && tiling.persistent)) {
    throw Error(Stage::config,
                fmt::format("attention: a trace (traces) needs the sm_90a kernel on its persistent grid (at "
                            "most kAttentionTraceCtas = {} CTAs); this plan's attention runs {}",
                            kAttentionTraceCtas, to_string(kernel)));
  }
  if (tiling.kv_tma && (!sm90 || kv_fp8 || !sm90_kv_tma_supported(head_dim, block_size, tiling.block_n))) {
    throw Error(
        Stage::config,
        fmt::format(
            "attention: TMA K/V loads need the sm_90a kernel, a bf16 cache, pages of at least 8 "
            "slots and at most 32 boxes per tile (with 128-key tiles at head_dim 256, 32 of K and 32 of V; "
            "block_size {}, head_dim {})",
            block_size, head_dim));
  }
  if (sm90 && tiling.stages < 2 &&
      !(tiling.stages == 1 && attention_sm90_kv_split(head_dim, tiling.block_n, tiling.kv_tma))) {
    throw Error(
        Stage::config,
        fmt::format("attention: the sm_90a kernel takes one stage only with K and V on their own "
                    "barriers (TMA at head_dim 256, block_n 128); got stages {}, block_n {}, head_dim {}, "
                    "kv_tma {}",
                    tiling.stages, tiling.block_n, head_dim, tiling.kv_tma));
  }
  compiler::KernelSource source;
  source.family = "attention";
  if (sm90) {
    source.header = "attnplan/attention_sm90.cuh";
    source.traits = "attnplan::kernels::AttentionSm90Traits";
    source.kernel = "attnplan::kernels::attention_sm90_kernel";
    source.arguments = {
        {"head_dim", std::to_string(head_dim)},
        {"group_size", std::to_string(group_size)},
        {"heads_per_cta", std::to_string(tiling.heads_per_cta)},
        {"block_size", std::to_string(block_size)},
        {"block_n", std::to_string(tiling.block_n)},
        {"has_window", cxx_bool(has_window)},
        {"has_spans", cxx_bool(has_spans)},
        {"has_sinks", cxx_bool(has_sinks)},
        {"has_softcap", cxx_bool(has_softcap)},
        {"stages", std::to_string(tiling.stages)},
        {"overlap_softmax", cxx_bool(tiling.overlap_softmax)},
        {"ping_pong", cxx_bool(tiling.ping_pong)},
        {"kv_tma", cxx_bool(tiling.kv_tma)},
        {"kv_fp8", cxx_bool(kv_fp8)},
        {"consumers", std::to_string(tiling.block_m / 64)},
        {"splits_tail", cxx_bool(splits_tail)},
        {"traces", cxx_bool(traces)},
    };
    source.grid_constant = true;  // the kernel takes the address of its parameters (and TMA of its maps)
  } else {
    source.header = "attnplan/attention.cuh";
    source.traits = "attnplan::kernels::AttentionTraits";
    source.kernel = "attnplan::kernels::attention_kernel";
    source.arguments = {
        {"head_dim", std::to_string(head_dim)},
        {"value_head_dim", std::to_string(value_head_dim)},
        {"group_size", std::to_string(group_size)},
        {"block_size", std::to_string(block_size)},
        {"block_m", std::to_string(tiling.block_m)},
        {"block_n", std::to_string(tiling.block_n)},
        {"min_blocks_per_sm", std::to_string(tiling.min_blocks_per_sm)},
        {"has_softcap", cxx_bool(has_softcap)},
        {"has_window", cxx_bool(has_window)},
        {"has_spans", cxx_bool(has_spans)},
        {"has_sinks", cxx_bool(has_sinks)},
        {"kv_fp8", cxx_bool(kv_fp8)},
    };
  }
  source.spec = {{"family", source.family},
                 {"head_dim", head_dim},
                 {"value_head_dim", value_head_dim},
                 {"group_size", group_size},
                 {"block_size", block_size},
                 {"block_m", tiling.block_m},
                 {"block_n", tiling.block_n},
                 {"stages", tiling.stages},
                 {"warps", threads() / 32},
                 {"has_softcap", has_softcap},
                 {"has_window", has_window},
                 {"has_spans", has_spans},
                 {"has_sinks", has_sinks},
                 {"kv_fp8", kv_fp8},
                 {"dynamic_shared_bytes", dynamic_shared_bytes()}};
  if (sm90) {
    source.spec["kernel"] = to_string(kernel);
    source.spec["heads_per_cta"] = tiling.heads_per_cta;
    source.spec["overlap_softmax"] = tiling.overlap_softmax;
    source.spec["ping_pong"] = tiling.ping_pong;
    source.spec["kv_tma"] = tiling.kv_tma;
    source.spec["splits_tail"] = splits_tail;
    source.spec["traces"] = traces;
  } else {
    source.spec["min_blocks_per_sm"] = tiling.min_blocks_per_sm;
  }
  return source;
}

int AttentionSpec::dynamic_shared_bytes() const {
  if (kernel == AttentionKernel::wgmma_sm90)
    return sm90_attention_shared_bytes(head_dim, tiling.block_n, tiling.stages, kv_fp8, tiling.kv_tma,
                                       tiling.block_m);
  return attention_shared_bytes(head_dim, value_head_dim, tiling.block_m, tiling.block_n, tiling.stages,
                                kv_fp8);
}

driver::LaunchShape AttentionSpec::launch_shape(int num_seqs, int max_query_len, int query_heads,
                                                int multiprocessors) const {
  if (num_seqs <= 0 || num_seqs > 65535 || max_query_len <= 0 || query_heads <= 0 || query_heads > 65535) {
    throw Error(
        Stage::input,
        fmt::format("attention: no launch shape for num_seqs = {}, max_query_len = {}, query_heads = {}",
                    num_seqs, max_query_len, query_heads));
  }
  // The sm_90a kernel packs heads_per_cta heads of a kv group into a CTA's rows (1 for mma.sync).
  const int heads = kernel == AttentionKernel::wgmma_sm90 ? tiling.heads_per_cta : 1;
  if (heads < 1 || query_heads % heads != 0) {
    throw Error(Stage::input, fmt::format("attention: query_heads = {} is not a multiple of heads_per_cta {}",
                                          query_heads, heads));
  }
  const int tokens = tiling.block_m / heads;
  const unsigned query_tiles = static_cast<unsigned>((max_query_len + tokens - 1) / tokens);
  const driver::Dim3 block{static_cast<unsigned>(threads()), 1, 1};
  if (kernel != AttentionKernel::wgmma_sm90) {
    return driver::LaunchShape{
        {query_tiles, static_cast<unsigned>(num_seqs), static_cast<unsigned>(query_heads)},
        block,
        static_cast<unsigned>(dynamic_shared_bytes())};
  }
  // The kernel numbers its items (and its rounds times the grid) in an int.
  const long long items = static_cast<long long>(query_tiles) * num_seqs * (query_heads / heads);
  if (items > (1LL << 30)) {
    throw Error(Stage::input, fmt::format("attention: {} work items ({} query tiles x {} sequences x {} head "
                                          "groups) exceed 2^30",
                                          items, query_tiles, num_seqs, query_heads / heads));
  }
  const long long ctas =
      tiling.persistent && multiprocessors > 0 ? std::min<long long>(items, multiprocessors) : items;
  return driver::LaunchShape{
      {static_cast<unsigned>(ctas), 1, 1}, block, static_cast<unsigned>(dynamic_shared_bytes())};
}

void AttentionSpec::check(const AttentionParams& params, int query_heads) const {
  require(
      query_heads > 0 && query_heads % group_size == 0,
      fmt::format("query_heads = {} is not a positive multiple of group_size {}", query_heads, group_size));
  require(params.kv_heads == query_heads / group_size,
          fmt::format("kv_heads = {} but query_heads / group_size = {}", params.kv_heads,
                      query_heads / group_size));
  require(!dynamic_items() || params.item_counter != nullptr,
          "item_counter: null, but this kernel claims its work items from it (a zeroed int)");
  require(params.query != nullptr && aligned(params.query, 16), "query: null or not 16-byte aligned");
  require(params.key_cache != nullptr && aligned(params.key_cache, 16),
          "key_cache: null or not 16-byte aligned");
  require(params.value_cache != nullptr && aligned(params.value_cache, 16),
          "value_cache: null or not 16-byte aligned");
  require(params.output != nullptr && aligned(params.output, 16), "output: null or not 16-byte aligned");
  const long long query_width = static_cast<long long>(query_heads) * head_dim;
  const long long output_width = static_cast<long long>(query_heads) * value_head_dim;
  require(params.query_row_stride >= query_width && params.query_row_stride % 8 == 0,
          fmt::format("query_row_stride = {} must be >= query_heads * head_dim = {} and a multiple of 8",
                      params.query_row_stride, query_width));
  require(
      params.output_row_stride >= output_width && params.output_row_stride % 8 == 0,
      fmt::format("output_row_stride = {} must be >= query_heads * value_head_dim = {} and a multiple of 8",
                  params.output_row_stride, output_width));
  require(params.query_starts != nullptr && params.context_lens != nullptr && params.block_tables != nullptr,
          "query_starts, context_lens and block_tables must be set");
  require(params.num_seqs > 0, fmt::format("num_seqs = {} must be positive", params.num_seqs));
  require(params.max_query_len > 0, fmt::format("max_query_len = {} must be positive", params.max_query_len));
  require(params.max_blocks_per_seq > 0,
          fmt::format("max_blocks_per_seq = {} must be positive", params.max_blocks_per_seq));
  require(params.num_blocks > 0, fmt::format("num_blocks = {} must be positive", params.num_blocks));
  // The kernel indexes slots (page * block_size + offset) in 32-bit ints.
  require(
      static_cast<long long>(params.num_blocks) * block_size <= 0x7fffffff,
      fmt::format("num_blocks = {} x block_size {} slots exceed 2^31 - 1", params.num_blocks, block_size));
  if (has_window) require(params.window >= 1, fmt::format("window = {} must be >= 1", params.window));
  if (has_softcap) require(params.softcap > 0.0f, fmt::format("softcap = {} must be > 0", params.softcap));
  if (has_spans) {
    // span_bounds may be null only when no sequence has a span; the host cannot see the counts.
    require(params.span_offsets != nullptr,
            "span_offsets must be set: the kernel was specialized with spans");
  }
  if (has_sinks) require(params.sinks != nullptr, "sinks must be set: the kernel was specialized with sinks");
  // The sequence-major walk covers the sequences seq_order lists: every one, once.
  require(params.ordered_seqs == 0 ||
              (params.ordered_seqs == params.num_seqs && params.ordered_seqs <= kAttentionOrderedSeqs),
          fmt::format("ordered_seqs = {} must be 0 or num_seqs = {} (at most {})", params.ordered_seqs,
                      params.num_seqs, kAttentionOrderedSeqs));
  require(params.ordered_seqs == 0 || kernel == AttentionKernel::wgmma_sm90,
          "ordered_seqs: only the sm_90a kernel walks its items in a given order (0 for mma.sync)");
  std::bitset<kAttentionOrderedSeqs> listed;  // ordered_seqs <= kAttentionOrderedSeqs, checked above
  for (int i = 0; i < params.ordered_seqs; ++i) {
    const int seq = params.seq_order[i];
    require(seq < params.num_seqs && !listed[seq],
            fmt::format("seq_order[{}] = {} is outside [0, num_seqs = {}) or listed twice (the order must "
                        "list every sequence once)",
                        i, seq, params.num_seqs));
    listed[seq] = true;
  }
  require(params.whole_chunk_spans == 0 ||
              (params.whole_chunk_spans == 1 && has_spans && kernel == AttentionKernel::wgmma_sm90),
          fmt::format("whole_chunk_spans = {} must be 0, or 1 for the sm_90a kernel with spans",
                      params.whole_chunk_spans));
  require(params.split_items >= 0, fmt::format("split_items = {} must be >= 0", params.split_items));
  if (params.split_items > 0) {
    require(splits_tail,
            fmt::format("split_items = {}: this attention kernel does not split its tail (only the sm_90a "
                        "kernel with splits_tail does: the plan's attention_split)",
                        params.split_items));
    require(params.split_parts >= 2 && params.split_parts <= kAttentionMaxSplitParts,
            fmt::format("split_parts = {} must be in [2, {}]", params.split_parts, kAttentionMaxSplitParts));
    const driver::LaunchShape shape = launch_shape(params.num_seqs, params.max_query_len, query_heads);
    require(
        params.split_items <= static_cast<long long>(shape.grid.x),
        fmt::format("split_items = {} exceeds the launch's {} work items", params.split_items, shape.grid.x));
    require(static_cast<long long>(params.split_items) * params.split_parts <= kMaxTailSplitUnits,
            fmt::format("split_items = {} x split_parts = {} exceed the {} parts a workspace holds",
                        params.split_items, params.split_parts, kMaxTailSplitUnits));
    require(params.split_partials != nullptr && params.split_counters != nullptr,
            "split_partials and split_counters must be set for a split tail");
  }
  if (traces) {
    require(params.trace != nullptr,
            "trace must be set: the kernel was specialized with a trace (kAttentionTraceBytes of records)");
  }
  if (kv_fp8) {
    for (const auto& [name, scale] :
         {std::pair{"k_scale", params.k_scale}, std::pair{"v_scale", params.v_scale}}) {
      require(std::isfinite(scale) && scale > 0.0f,
              fmt::format("{} = {} must be finite and > 0 (fp8 KV cache)", name, scale));
    }
  }
}

bool every_chunk_one_span(std::span<const int> query_starts, std::span<const int> context_lens,
                          std::span<const int> span_offsets, std::span<const int> span_bounds) {
  if (span_offsets.empty()) return false;  // no spans: every chunk is causal
  for (std::size_t s = 0; s < context_lens.size(); ++s) {
    const int chunk = query_starts[s + 1] - query_starts[s];
    if (chunk == 0) continue;
    const int begin = context_lens[s], end = begin + chunk;
    bool whole = false;
    for (int i = span_offsets[s]; i < span_offsets[s + 1] && !whole; ++i)
      whole = span_bounds[2 * i] == begin && span_bounds[2 * i + 1] == end;
    if (!whole) return false;
  }
  return true;
}

std::vector<int> longest_first_sequences(std::span<const int> query_starts, std::span<const int> context_lens,
                                         std::span<const int> span_offsets,
                                         std::span<const int> span_bounds) {
  const int seqs = static_cast<int>(context_lens.size());
  // More sequences than seq_order holds: tile-major.
  if (seqs > kAttentionOrderedSeqs ||
      !every_chunk_one_span(query_starts, context_lens, span_offsets, span_bounds)) {
    return {};
  }
  const auto chunk_len = [&](int s) { return query_starts[s + 1] - query_starts[s]; };
  // Every sequence, so that the walk covers the batch whatever the host arrays say (a graph replayed over
  // other chunk lengths keeps this order: it may then be slower, never incomplete); empty chunks last.
  const auto keys = [&](int s) {
    return chunk_len(s) == 0 ? -1LL : static_cast<long long>(context_lens[s]) + chunk_len(s);
  };
  std::vector<int> sequences(seqs);
  std::iota(sequences.begin(), sequences.end(), 0);
  std::stable_sort(sequences.begin(), sequences.end(), [&](int a, int b) { return keys(a) > keys(b); });
  return sequences;
}

TailSplit split_tail_items(long long items, int ctas, int tiles, int max_units) {
  if (ctas <= 0 || items <= ctas) return {};
  const long long tail = items - (items - 1) / ctas * ctas;  // the last round's items, 1..ctas
  if (2 * tail > ctas) return {};
  const long long parts =
      std::min<long long>({kAttentionMaxSplitParts, ctas / tail, tiles / 2, max_units / tail});
  if (parts < 2) return {};
  return TailSplit{static_cast<int>(tail), static_cast<int>(parts)};
}

std::optional<AttentionSpec> split_tail_specialization(const AttentionSpec& planned) {
  if (planned.kernel != AttentionKernel::wgmma_sm90 || !planned.has_spans ||
      !attention_sm90_splits(planned.head_dim)) {
    return std::nullopt;
  }
  AttentionSpec split = planned;
  split.splits_tail = true;
  return split;
}

std::optional<AttentionSpec> short_launch_specialization(const AttentionSpec& planned) {
  if (planned.kernel != AttentionKernel::wgmma_sm90 || planned.head_dim != 64 ||
      planned.tiling.block_m != 192 || planned.kv_fp8 || planned.splits_tail) {
    return std::nullopt;
  }
  AttentionSpec short_launch = planned;
  short_launch.tiling.block_m = 128;
  short_launch.tiling.overlap_softmax = short_launch.tiling.stages >= 3;
  short_launch.tiling.ping_pong = !short_launch.tiling.overlap_softmax;
  short_launch.tiling.shared_bytes = short_launch.dynamic_shared_bytes();
  return short_launch;
}

bool takes_short_launch(const AttentionSpec& planned, std::span<const int> query_starts, int query_heads,
                        int multiprocessors) {
  const std::optional<AttentionSpec> short_launch = short_launch_specialization(planned);
  if (!short_launch || multiprocessors <= 0 || query_starts.size() < 2 ||
      query_heads % planned.tiling.heads_per_cta != 0) {
    return false;
  }
  const std::size_t seqs = query_starts.size() - 1;
  // Work items with rows (one per query tile of each chunk and head group) and the rounds of the grid they
  // take, for a kernel of `block_m` rows.
  const long long groups = query_heads / planned.tiling.heads_per_cta;
  const auto rounds = [&](int block_m) {
    const int tokens = block_m / planned.tiling.heads_per_cta;  // an item's tokens
    long long items = 0;
    for (std::size_t s = 0; s < seqs; ++s) {
      items += (query_starts[s + 1] - query_starts[s] + tokens - 1) / tokens * groups;
    }
    return (items + multiprocessors - 1) / multiprocessors;
  };
  const long long short_rounds = rounds(short_launch->tiling.block_m);
  return short_rounds <= 2 && short_rounds <= rounds(planned.tiling.block_m);
}

TailSplit choose_tail_split(const AttentionSpec& spec, std::span<const int> query_starts,
                            std::span<const int> context_lens, bool sequence_major, int query_heads,
                            int multiprocessors, int max_units) {
  const int seqs = static_cast<int>(context_lens.size());
  if (spec.kernel != AttentionKernel::wgmma_sm90 || !spec.splits_tail ||
      !attention_sm90_splits(spec.head_dim) || !sequence_major || !spec.tiling.persistent ||
      multiprocessors <= 0 || seqs == 0 || query_starts.size() != context_lens.size() + 1) {
    return {};
  }
  const int chunk = query_starts[1] - query_starts[0];
  for (int s = 0; s < seqs; ++s) {
    if (query_starts[s + 1] - query_starts[s] != chunk || context_lens[s] != context_lens[0]) return {};
  }
  if (chunk <= 0) return {};
  // One CTA per item without the SM count: the grid is then the item count.
  const unsigned items = spec.launch_shape(seqs, chunk, query_heads).grid.x;
  const unsigned ctas = spec.launch_shape(seqs, chunk, query_heads, multiprocessors).grid.x;
  // One bidirectional span a chunk: each item sees the sequence's keys [0, context + chunk).
  const int tiles = (context_lens[0] + chunk + spec.tiling.block_n - 1) / spec.tiling.block_n;
  return split_tail_items(items, static_cast<int>(ctas), tiles, max_units);
}

void set_item_order(AttentionParams& params, std::span<const int> sequences) {
  require(sequences.size() <= std::size_t(kAttentionOrderedSeqs),
          fmt::format("seq_order: {} sequences, at most {}", sequences.size(), kAttentionOrderedSeqs));
  params.ordered_seqs = static_cast<int>(sequences.size());
  for (std::size_t i = 0; i < sequences.size(); ++i)
    params.seq_order[i] = static_cast<unsigned short>(sequences[i]);
}

void launch_attention(const driver::Function& function, const AttentionSpec& spec,
                      const AttentionParams& params, int query_heads, CUstream stream, int multiprocessors) {
  const driver::LaunchShape shape =
      spec.launch_shape(params.num_seqs, params.max_query_len, query_heads, multiprocessors);
  if (spec.kernel != AttentionKernel::wgmma_sm90 || !spec.tiling.kv_tma) {
    driver::launch(function, shape, stream, params);
    return;
  }
  AttentionSm90Params sm90{};
  sm90.common = params;
  const long long slots = static_cast<long long>(params.num_blocks) * spec.block_size;
  const long long row = static_cast<long long>(params.kv_heads) * spec.head_dim;  // one slot's elements
  const int box_rows = std::min(spec.block_size, spec.tiling.block_n);
  encode_tensor_map(sm90.key_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, params.key_cache, row, slots, row, 64,
                    box_rows, "attention key_cache");
  encode_tensor_map(sm90.value_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, params.value_cache, row, slots, row,
                    64, box_rows, "attention value_cache");
  driver::launch(function, shape, stream, sm90);
}

}  // namespace attnplan::plan
