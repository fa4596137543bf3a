// The attention kernel's tile heuristic, spec rendering and Params checks (pure), and real NVRTC compiles
// of its specializations for sm_80 and sm_90a with their ptxas resource reports (no GPU needed).
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "compiler/compiler.hpp"
#include "compiler/parallel.hpp"
#include "config/parse.hpp"
#include "core/error.hpp"
#include "plan/attention_spec.hpp"
#include "plan_testing.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using namespace attnplan;
using namespace attnplan::plan_testing;
using namespace attnplan::plan;

namespace {

AttentionSpec make_spec(int head_dim, int value_head_dim, int group_size, int block_size, config::Arch arch,
                        bool all_features = false, bool kv_fp8 = false) {
  AttentionSpec spec;
  spec.head_dim = head_dim;
  spec.value_head_dim = value_head_dim;
  spec.group_size = group_size;
  spec.block_size = block_size;
  spec.has_softcap = spec.has_window = spec.has_spans = spec.has_sinks = all_features;
  spec.kv_fp8 = kv_fp8;
  spec.tiling = choose_attention_tiling(head_dim, value_head_dim, arch, kv_fp8);
  return spec;
}

// A valid Params for Llama-3.1-8B (Hq 32, Hkv 8, D 128) reading q from the fused QKV rows.
AttentionParams llama_params() {
  AttentionParams params{};
  params.query = fake_pointer<const bf16_bits>(0x10000);
  params.key_cache = fake_pointer<const bf16_bits>(0x100000);
  params.value_cache = fake_pointer<const bf16_bits>(0x200000);
  params.output = fake_pointer<bf16_bits>(0x300000);
  params.query_starts = fake_pointer<const int>(0x400000);
  params.context_lens = fake_pointer<const int>(0x400100);
  params.block_tables = fake_pointer<const int>(0x400200);
  params.item_counter = fake_pointer<int>(0x400300);  // read by the sm_90a kernel only
  params.query_row_stride = (32 + 2 * 8) * 128;
  params.output_row_stride = 32 * 128;
  params.scale = 0.08838834764f;
  params.num_seqs = 3;
  params.max_query_len = 500;
  params.kv_heads = 8;
  params.max_blocks_per_seq = 64;
  params.num_blocks = 1000;
  return params;
}

}  // namespace

TEST_CASE("attention tiling: 8 warps up to 128-wide heads, 4 beyond; key tiles shrink to fit smem",
          "[plan][attention]") {
  const AttentionTiling llama = choose_attention_tiling(128, 128, kSm90a);
  CHECK(llama.block_m == 128);
  CHECK(llama.block_n == 64);
  CHECK(llama.warps() == 8);
  CHECK(llama.threads() == 256);
  CHECK(llama.shared_bytes == attention_shared_bytes(128, 128, 128, 64));
  CHECK(llama.shared_bytes == 2 * 64 * 4 + 2 * (128 * 136 + 2 * 64 * (136 + 136)));  // slots, Q, K/V stages

  const AttentionTiling wide = choose_attention_tiling(256, 256, kSm90a);
  CHECK(wide.block_m == 64);
  CHECK(wide.block_n == 64);
  // sm_89 has 99 KiB per block: 256-wide heads need 16-key tiles, 128-wide ones 32-key tiles.
  CHECK(choose_attention_tiling(256, 256, kSm89).block_n == 16);
  CHECK(choose_attention_tiling(240, 240, kSm89).block_n == 32);
  CHECK(choose_attention_tiling(128, 128, kSm89).block_n == 32);
  CHECK(choose_attention_tiling(256, 256, kSm80).block_n == 32);  // 163 KiB: 64-key tiles need 165.5
  CHECK(choose_attention_tiling(64, 64, kSm89).block_n == 64);
  // value_head_dim decides the warps as much as head_dim does.
  CHECK(choose_attention_tiling(128, 256, kSm90a).block_m == 64);
  CHECK(choose_attention_tiling(192, 128, kSm90a).block_m == 64);
  CHECK(choose_attention_tiling(120, 128, kSm90a).block_m == 128);
}

TEST_CASE("attention tiling: every config-valid head dim is either tiled to fit or rejected clearly",
          "[plan][attention]") {
  for (const config::Arch arch : {kSm80, kSm86, kSm89, kSm90a, kSm100a}) {
    for (int head_dim = 16; head_dim <= 512; head_dim += 8) {
      for (const int value_head_dim : {16, 64, head_dim, 256, 512}) {
        INFO(arch.name() << " head_dim " << head_dim << " value_head_dim " << value_head_dim);
        if (head_dim <= kMaxAttentionHeadDim && value_head_dim <= kMaxAttentionHeadDim) {
          const AttentionTiling t = choose_attention_tiling(head_dim, value_head_dim, arch);
          CHECK(t.block_m % 16 == 0);
          CHECK(t.block_n % 16 == 0);
          CHECK(t.shared_bytes <= max_shared_bytes_per_block(arch));
          CHECK(t.shared_bytes == attention_shared_bytes(head_dim, value_head_dim, t.block_m, t.block_n));
        } else {
          try {
            choose_attention_tiling(head_dim, value_head_dim, arch);
            FAIL("accepted an unsupported head dim");
          } catch (const Error& error) {
            CHECK(error.stage() == Stage::config);
            CHECK(error.message().find(head_dim > kMaxAttentionHeadDim ? "head_dim" : "value_head_dim") !=
                  std::string::npos);
            CHECK(error.message().find("not supported") != std::string::npos);
          }
        }
      }
    }
  }
  CHECK_THROWS_AS(choose_attention_tiling(100, 128, kSm90a), Error);  // not a multiple of 8
  CHECK_THROWS_AS(choose_attention_tiling(8, 8, kSm90a), Error);
}

TEST_CASE("attention spec from a config: shapes, flags and the arch's tiling", "[plan][attention]") {
  const config::AttentionConfig gpt_oss = config::parse(nlohmann::json{{"schema", "attnplan/v1"},
                                                                       {"hidden_size", 2880},
                                                                       {"query_heads", 64},
                                                                       {"kv_heads", 8},
                                                                       {"head_dim", 64},
                                                                       {"sliding_window", 128},
                                                                       {"sinks", true},
                                                                       {"kv_cache", {{"block_size", 32}}}});
  // On sm_80: the mma.sync kernel (sm_90a takes these configs to the wgmma kernel, tested below).
  const AttentionSpec spec = AttentionSpec::from_config(gpt_oss, kSm80);
  CHECK(spec.head_dim == 64);
  CHECK(spec.value_head_dim == 64);
  CHECK(spec.group_size == 8);
  CHECK(spec.block_size == 32);
  CHECK(spec.has_window);
  CHECK(spec.has_sinks);
  CHECK_FALSE(spec.has_softcap);
  CHECK_FALSE(spec.has_spans);
  CHECK(spec.tiling == choose_attention_tiling(64, 64, kSm80));

  const compiler::KernelSource source = spec.source();
  const std::string stub = source.render_stub();
  CHECK(stub.find("#include \"attnplan/attention.cuh\"") != std::string::npos);
  CHECK(stub.find("/*head_dim=*/64, /*value_head_dim=*/64, /*group_size=*/8, /*block_size=*/32") !=
        std::string::npos);
  CHECK(stub.find("/*has_softcap=*/false, /*has_window=*/true, /*has_spans=*/false, /*has_sinks=*/true") !=
        std::string::npos);
  CHECK(source.spec.at("dynamic_shared_bytes") == spec.dynamic_shared_bytes());

  nlohmann::json fp8_cache = {{"schema", "attnplan/v1"},
                              {"hidden_size", 4096},
                              {"query_heads", 32},
                              {"kv_heads", 8},
                              {"kv_cache", {{"block_size", 16}, {"dtype", "fp8_e4m3"}}}};
  const AttentionSpec fp8 = AttentionSpec::from_config(config::parse(fp8_cache), kSm80);
  CHECK(fp8.kv_fp8);
  CHECK(fp8.tiling == choose_attention_tiling(128, 128, kSm80, true));
  CHECK(fp8.source().render_stub().find("/*has_sinks=*/false, /*kv_fp8=*/true") != std::string::npos);
  CHECK(fp8.source().spec.at("kv_fp8") == true);

  const driver::LaunchShape shape = spec.launch_shape(3, 300, 64);
  CHECK(shape.grid.x == 3);  // ceil(300 / 128)
  CHECK(shape.grid.y == 3);
  CHECK(shape.grid.z == 64);
  CHECK(shape.block.x == 256);
  CHECK(shape.dynamic_shared_bytes == unsigned(spec.dynamic_shared_bytes()));
  CHECK_THROWS_AS(spec.launch_shape(0, 300, 64), Error);
  CHECK_THROWS_AS(spec.launch_shape(3, 0, 64), Error);
  CHECK_THROWS_AS(spec.launch_shape(70000, 1, 64), Error);
}

TEST_CASE("attention shared memory with an fp8 cache: byte staging per stage, one bf16 K/V tile",
          "[plan][attention][fp8kv]") {
  // D 128, bm 128, bn 64: slot table 2 x 64 x 4; bf16 Q [128, 136] + one K and V [64, 136]; staging 2 x 64
  // x (128 + 128) bytes.
  CHECK(attention_shared_bytes(128, 128, 128, 64, 2, true) ==
        512 + 2 * (128 * 136 + 64 * 272) + 2 * 64 * 256);
  CHECK(attention_shared_bytes(128, 128, 128, 64, 2, false) == 512 + 2 * (128 * 136 + 2 * 64 * 272));
  // Dv 40 (odd multiple of 8): rows of 40 codes, bf16 rows padded to 48 + 8.
  CHECK(attention_shared_bytes(72, 40, 128, 64, 2, true) ==
        512 + 2 * (128 * 88 + 64 * (88 + 56)) + 2 * 64 * 112);
  // Every head dim the bf16 kernel tiles, the fp8 one tiles too, within the arch's limit.
  for (const config::Arch arch : {kSm80, kSm90a, config::Arch{8, 6, false}}) {
    for (int dim = 16; dim <= kMaxAttentionHeadDim; dim += 8) {
      const AttentionTiling tiling = choose_attention_tiling(dim, dim, arch, true);
      INFO(arch.name() << " dim " << dim);
      CHECK(tiling.shared_bytes == attention_shared_bytes(dim, dim, tiling.block_m, tiling.block_n, 2, true));
      CHECK(tiling.shared_bytes <= max_shared_bytes_per_block(arch));
    }
  }
}

TEST_CASE("the sm_90a kernel walks prompts that are one span each longest first", "[plan][attention]") {
  // Chunks of 129, 0, 200 and 700 tokens, each one span (the second has no chunk and no span), keys 129,
  // 1000, 500 and 700: sequence-major by decreasing keys, the empty chunk last whatever its prefix (every
  // sequence is walked, so a graph replayed over other lengths still covers the batch).
  const std::vector<int> starts = {0, 129, 129, 329, 1029};
  const std::vector<int> contexts = {0, 1000, 300, 0};
  const std::vector<int> offsets = {0, 1, 1, 2, 3};
  const std::vector<int> whole = {0, 129, 300, 500, 0, 700};
  CHECK(longest_first_sequences(starts, contexts, offsets, whole) == std::vector<int>{3, 2, 0, 1});
  // Without spans every chunk is causal, and a chunk that is not one span has causal rows: their cost grows
  // with the query tile, which the tile-major walk counts down.
  CHECK(longest_first_sequences(starts, contexts, {}, {}).empty());
  const std::vector<int> short_of_the_end = {0, 129, 300, 499, 0, 700};
  CHECK(longest_first_sequences(starts, contexts, offsets, short_of_the_end).empty());
  const std::vector<int> two_spans_offsets = {0, 1, 1, 3, 4};
  const std::vector<int> two_spans = {0, 129, 300, 400, 400, 500, 0, 700};
  CHECK(longest_first_sequences(starts, contexts, two_spans_offsets, two_spans).empty());
  // Ties keep the batch's order. One sequence with a chunk walks sequence-major too (its kv heads one after
  // another).
  const std::vector<int> equal_starts = {0, 100, 200}, equal_contexts = {0, 0}, equal_offsets = {0, 1, 2};
  const std::vector<int> equal_bounds = {0, 100, 0, 100};
  CHECK(longest_first_sequences(equal_starts, equal_contexts, equal_offsets, equal_bounds) ==
        std::vector<int>{0, 1});
  const std::vector<int> one_starts = {0, 0, 50}, one_offsets = {0, 0, 1}, one_bounds = {0, 50};
  CHECK(longest_first_sequences(one_starts, equal_contexts, one_offsets, one_bounds) ==
        std::vector<int>{1, 0});
  // At most kAttentionOrderedSeqs sequences (AttentionParams::seq_order's entries); more walk tile-major.
  for (const int seqs : {kAttentionOrderedSeqs, kAttentionOrderedSeqs + 1}) {
    std::vector<int> many_starts = {0}, many_contexts, many_offsets = {0}, many_bounds;
    for (int s = 0; s < seqs; ++s) {
      const int chunk = 1 + s % 7;
      many_starts.push_back(many_starts.back() + chunk);
      many_contexts.push_back(0);
      many_offsets.push_back(s + 1);
      many_bounds.insert(many_bounds.end(), {0, chunk});
    }
    const std::vector<int> order =
        longest_first_sequences(many_starts, many_contexts, many_offsets, many_bounds);
    INFO(seqs);
    // The span walk is skipped whatever the count: it does not need seq_order.
    CHECK(every_chunk_one_span(many_starts, many_contexts, many_offsets, many_bounds));
    if (seqs > kAttentionOrderedSeqs) {
      CHECK(order.empty());
    } else {
      REQUIRE(order.size() == std::size_t(seqs));
      CHECK(order.front() == 6);   // the first of the 7-token chunks
      CHECK(order.back() == 126);  // the last of the 1-token chunks (s % 7 == 0)
    }
  }
}

TEST_CASE("non-causal prompts, every chunk one span over itself, skip the span walk", "[plan][attention]") {
  // The batch above: chunks of 129, 0, 200 and 700 tokens after prefixes of 0, 1000, 300 and 0.
  const std::vector<int> starts = {0, 129, 129, 329, 1029};
  const std::vector<int> contexts = {0, 1000, 300, 0};
  const std::vector<int> offsets = {0, 1, 1, 2, 3};
  CHECK(every_chunk_one_span(starts, contexts, offsets, std::vector<int>{0, 129, 300, 500, 0, 700}));
  // A span inside the cached prefix beside the chunk's own: the chunk's rows see the prefix anyway.
  CHECK(every_chunk_one_span(starts, contexts, std::vector<int>{0, 1, 1, 3, 4},
                             std::vector<int>{0, 129, 10, 20, 300, 500, 0, 700}));
  // No spans; a span one key short of the chunk; a chunk in two spans; a chunk without its span.
  CHECK_FALSE(every_chunk_one_span(starts, contexts, {}, {}));
  CHECK_FALSE(every_chunk_one_span(starts, contexts, offsets, std::vector<int>{0, 129, 300, 499, 0, 700}));
  CHECK_FALSE(every_chunk_one_span(starts, contexts, std::vector<int>{0, 1, 1, 3, 4},
                                   std::vector<int>{0, 129, 300, 400, 400, 500, 0, 700}));
  CHECK_FALSE(every_chunk_one_span(starts, contexts, std::vector<int>{0, 1, 1, 1, 2},
                                   std::vector<int>{0, 129, 0, 700}));
}

TEST_CASE("the sm_90a kernel splits a tail round that would leave most CTAs idle", "[plan][attention]") {
  // D 64's 4k bidirectional row: 86 query tiles x 8 head groups = 688 items on 132 CTAs, 5 full rounds
  // and 28 items: each cut into 4 parts (132 / 28 = 4), 32 key tiles an item.
  CHECK(split_tail_items(688, 132, 32, kMaxTailSplitUnits) == TailSplit{28, 4});
  // D 64 1k: 176 items, 44 in the last round: 3 parts fill the grid.
  CHECK(split_tail_items(176, 132, 8, kMaxTailSplitUnits) == TailSplit{44, 3});
  // A last round more than half full (D 128 1k: 256 items, 124 left), whole rounds, or one round: none.
  CHECK(split_tail_items(256, 132, 8, kMaxTailSplitUnits) == TailSplit{});
  CHECK(split_tail_items(264, 132, 8, kMaxTailSplitUnits) == TailSplit{});
  CHECK(split_tail_items(100, 132, 8, kMaxTailSplitUnits) == TailSplit{});
  CHECK(split_tail_items(688, 0, 32, kMaxTailSplitUnits) == TailSplit{});
  // Exactly half full splits in two; parts capped at kAttentionMaxSplitParts, at two tiles a part and at
  // the workspace's units.
  CHECK(split_tail_items(132 + 66, 132, 32, kMaxTailSplitUnits) == TailSplit{66, 2});
  CHECK(split_tail_items(132 * 31 + 4, 132, 128, kMaxTailSplitUnits) ==
        TailSplit{4, kAttentionMaxSplitParts});
  CHECK(split_tail_items(688, 132, 6, kMaxTailSplitUnits) == TailSplit{28, 3});
  CHECK(split_tail_items(688, 132, 3, kMaxTailSplitUnits) == TailSplit{});
  CHECK(split_tail_items(688, 132, 32, 60) == TailSplit{28, 2});
  CHECK(split_tail_items(688, 132, 32, 50) == TailSplit{});

  // From a batch: the sm_90a kernel's sequence-major walk, every chunk alike. Llama's D 128 (32 tokens an
  // item, 8 head groups): one chunk of 1088 tokens is 34 x 8 = 272 items, 8 past two rounds of 132.
  AttentionSpec spec = make_spec(128, 128, 4, 64, kSm90a);
  spec.kernel = AttentionKernel::wgmma_sm90;
  spec.has_spans = true;
  spec.tiling = choose_sm90_attention_tiling(128, 4);
  REQUIRE(spec.tiling.heads_per_cta == 4);
  REQUIRE(spec.tiling.persistent);
  const std::vector<int> one = {0, 1088}, no_context = {0};
  // The planned kernel has no split tail compiled in: only its split-tail specialization splits.
  CHECK(choose_tail_split(spec, one, no_context, true, 32, 132, kMaxTailSplitUnits) == TailSplit{});
  spec.splits_tail = true;
  CHECK(choose_tail_split(spec, one, no_context, true, 32, 132, kMaxTailSplitUnits) == TailSplit{8, 4});
  // Not on the tile-major walk, not without SMs, not where the chunks or contexts differ.
  CHECK(choose_tail_split(spec, one, no_context, false, 32, 132, kMaxTailSplitUnits) == TailSplit{});
  CHECK(choose_tail_split(spec, one, no_context, true, 32, 0, kMaxTailSplitUnits) == TailSplit{});
  const std::vector<int> two = {0, 1088, 2176}, equal = {0, 0}, unequal = {0, 64};
  CHECK(choose_tail_split(spec, two, equal, true, 32, 132, kMaxTailSplitUnits) == TailSplit{16, 4});
  CHECK(choose_tail_split(spec, two, unequal, true, 32, 132, kMaxTailSplitUnits) == TailSplit{});
  const std::vector<int> ragged = {0, 1088, 2000};
  CHECK(choose_tail_split(spec, ragged, equal, true, 32, 132, kMaxTailSplitUnits) == TailSplit{});
  // A prefix adds key tiles, not items: 1088 + 4000 keys are 40 tiles.
  const std::vector<int> prefix = {4000};
  CHECK(choose_tail_split(spec, one, prefix, true, 32, 132, kMaxTailSplitUnits) == TailSplit{8, 4});
  // D 256 splits too (attention_sm90_splits, since session 53): 272 items again, over 17 tiles of 64 keys or
  // 9 of the split's 128; the mma.sync kernel does not.
  AttentionSpec wide = spec;
  wide.head_dim = wide.value_head_dim = 256;
  wide.tiling = choose_sm90_attention_tiling(256, 4);
  CHECK(choose_tail_split(wide, one, no_context, true, 32, 132, kMaxTailSplitUnits) == TailSplit{8, 4});
  wide.tiling = with_sm90_kv_tma(wide.tiling, 256, 64, /*has_softcap=*/false);
  REQUIRE(wide.tiling.block_n == 128);
  CHECK(choose_tail_split(wide, one, no_context, true, 32, 132, kMaxTailSplitUnits) == TailSplit{8, 4});
  AttentionSpec sm80 = spec;
  sm80.kernel = AttentionKernel::mma_sync;
  CHECK(choose_tail_split(sm80, one, no_context, true, 32, 132, kMaxTailSplitUnits) == TailSplit{});
}

TEST_CASE("D 64's short launches take two consumer warpgroups", "[plan][attention]") {
  // gpt-oss: D 64, group 8. The planned kernel: three consumer warpgroups, 192 rows (24 tokens of 8 heads).
  const nlohmann::json gpt_oss = {{"schema", "attnplan/v1"},
                                  {"hidden_size", 2880},
                                  {"query_heads", 64},
                                  {"kv_heads", 8},
                                  {"head_dim", 64},
                                  {"sinks", true},
                                  {"kv_cache", {{"block_size", 64}}}};
  const config::AttentionConfig config = config::parse(gpt_oss);
  const AttentionSpec planned = AttentionSpec::from_config(config, kSm90a);
  REQUIRE(planned.tiling.block_m == 192);
  const std::optional<AttentionSpec> two = short_launch_specialization(planned);
  REQUIRE(two.has_value());
  CHECK(two->tiling.block_m == 128);
  CHECK(two->threads() == 384);
  CHECK(two->tiling.overlap_softmax);
  CHECK_FALSE(two->tiling.ping_pong);
  CHECK(two->tiling.kv_tma == planned.tiling.kv_tma);
  CHECK(two->tiling.shared_bytes == two->dynamic_shared_bytes());
  CHECK(two->source().render_stub() != planned.source().render_stub());
  AttentionSpec same = *two;
  same.tiling = planned.tiling;
  CHECK(same == planned);  // only the tiling differs
  // A traced plan's short kernel is traced too (the bench's trace then shows the kernel a short launch runs).
  AttentionSpec traced = planned;
  traced.traces = true;
  const std::optional<AttentionSpec> traced_two = short_launch_specialization(traced);
  REQUIRE(traced_two.has_value());
  CHECK(traced_two->traces);
  CHECK(traced_two->tiling == two->tiling);
  // Not at D 128 or 256, not for mma.sync, an fp8 cache or a split-tail kernel.
  nlohmann::json wider = gpt_oss;
  wider["head_dim"] = 128;
  CHECK_FALSE(short_launch_specialization(AttentionSpec::from_config(config::parse(wider), kSm90a)));
  CHECK_FALSE(short_launch_specialization(AttentionSpec::from_config(config, kSm80)));
  for (auto change :
       {+[](AttentionSpec& s) { s.kv_fp8 = true; }, +[](AttentionSpec& s) { s.splits_tail = true; }}) {
    AttentionSpec other = planned;
    change(other);
    CHECK_FALSE(short_launch_specialization(other));
  }

  // 64 query heads: 8 head groups; the short kernel's items have 128 / 8 = 16 tokens, the planned
  // kernel's 24. A 1024-token prompt: 64 query tiles, 512 items, four rounds of 132; 512 tokens: 32 x 8 = 256
  // items, two rounds, as the planned kernel's 22 x 8 = 176.
  const std::vector<int> one_k = {0, 1024}, half_k = {0, 512};
  CHECK_FALSE(takes_short_launch(planned, one_k, 64, 132));
  CHECK(takes_short_launch(planned, half_k, 64, 132));
  CHECK(takes_short_launch(planned, one_k, 64, 264));  // a larger part: 512 <= 528
  // At most two rounds of the short kernel's items: 528 tokens are 33 x 8 = 264 items, two rounds; 529
  // tokens 34 x 8 = 272, a third (the planned kernel's 23 x 8 = 184 take two).
  CHECK(takes_short_launch(planned, std::vector<int>{0, 528}, 64, 132));
  CHECK_FALSE(takes_short_launch(planned, std::vector<int>{0, 529}, 64, 132));
  // And no more rounds than the planned kernel's: 384 tokens are 24 x 8 = 192 short items, two rounds,
  // against 16 x 8 = 128 planned ones in one (measured 7% slower on the short kernel, session 55); 256
  // tokens 128 short items, one round. A cached prefix changes nothing (the rule reads no context length):
  // a 256-token chunk after 16384 cached tokens ran 32% faster on the short kernel.
  CHECK_FALSE(takes_short_launch(planned, std::vector<int>{0, 384}, 64, 132));
  CHECK(takes_short_launch(planned, std::vector<int>{0, 256}, 64, 132));
  // Items are counted per chunk: four chunks of 128 tokens are 4 x 8 x 8 = 256 short items (4 x 6 x 8 = 192
  // planned ones).
  const std::vector<int> four = {0, 128, 256, 384, 512};
  CHECK(takes_short_launch(planned, four, 64, 128));
  CHECK_FALSE(takes_short_launch(planned, four, 64, 127));  // 256 > 254
  // Nothing without SMs, for a kernel without the specialization, or without a chunk.
  CHECK_FALSE(takes_short_launch(planned, half_k, 64, 0));
  CHECK_FALSE(takes_short_launch(*two, half_k, 64, 132));
  CHECK_FALSE(takes_short_launch(planned, std::vector<int>{0}, 64, 132));
}

TEST_CASE("attention Params checks name the broken field", "[plan][attention]") {
  AttentionSpec spec = make_spec(128, 128, 4, 16, kSm90a);
  spec.has_window = spec.has_softcap = spec.has_spans = spec.has_sinks = true;
  AttentionParams good = llama_params();
  good.window = 4096;
  good.softcap = 50.0f;
  good.span_offsets = fake_pointer<const int>(0x500000);
  good.span_bounds = fake_pointer<const int>(0x500100);
  good.sinks = fake_pointer<const float>(0x600000);
  CHECK_NOTHROW(spec.check(good, 32));

  auto rejected = [&](auto mutate, const std::string& field, int query_heads = 32) {
    AttentionParams bad = good;
    mutate(bad);
    try {
      spec.check(bad, query_heads);
      FAIL("accepted bad params: " << field);
    } catch (const Error& error) {
      CHECK(error.stage() == Stage::input);
      INFO(error.message());
      CHECK(error.message().find(field) != std::string::npos);
    }
  };
  rejected([](AttentionParams&) {}, "query_heads", 30);
  rejected([](AttentionParams& p) { p.kv_heads = 4; }, "kv_heads");
  rejected([](AttentionParams& p) { p.query = nullptr; }, "query");
  rejected([](AttentionParams& p) { p.query = fake_pointer<const bf16_bits>(0x10008); }, "query");
  rejected([](AttentionParams& p) { p.key_cache = fake_pointer<const bf16_bits>(0x100002); }, "key_cache");
  rejected([](AttentionParams& p) { p.value_cache = nullptr; }, "value_cache");
  rejected([](AttentionParams& p) { p.output = fake_pointer<bf16_bits>(0x300004); }, "output");
  rejected([](AttentionParams& p) { p.query_row_stride = 31 * 128; }, "query_row_stride");
  rejected([](AttentionParams& p) { p.query_row_stride = 6148; }, "query_row_stride");
  rejected([](AttentionParams& p) { p.output_row_stride = 4092; }, "output_row_stride");
  rejected([](AttentionParams& p) { p.block_tables = nullptr; }, "block_tables");
  rejected([](AttentionParams& p) { p.num_seqs = 0; }, "num_seqs");
  rejected([](AttentionParams& p) { p.max_query_len = 0; }, "max_query_len");
  rejected([](AttentionParams& p) { p.max_blocks_per_seq = 0; }, "max_blocks_per_seq");
  rejected([](AttentionParams& p) { p.num_blocks = 0; }, "num_blocks");
  rejected([](AttentionParams& p) { p.num_blocks = 200000000; }, "num_blocks");  // x 16 slots > 2^31
  rejected([](AttentionParams& p) { p.window = 0; }, "window");
  rejected([](AttentionParams& p) { p.softcap = 0.0f; }, "softcap");
  rejected([](AttentionParams& p) { p.span_offsets = nullptr; }, "span_offsets");
  rejected([](AttentionParams& p) { p.sinks = nullptr; }, "sinks");

  // Without the features, their fields are ignored.
  const AttentionSpec plain = make_spec(128, 128, 4, 16, kSm90a);
  AttentionParams bare = llama_params();
  CHECK_NOTHROW(plain.check(bare, 32));

  // The sm_90a kernel claims its work items from item_counter, with ping-pong turns or without: a launch
  // must set it. mma.sync ignores it.
  AttentionSpec claims = plain;
  claims.kernel = AttentionKernel::wgmma_sm90;
  claims.tiling = choose_sm90_attention_tiling(128, 4);
  REQUIRE(claims.dynamic_items());
  CHECK_NOTHROW(claims.check(bare, 32));
  bare.item_counter = nullptr;
  CHECK(expect_error([&] { claims.check(bare, 32); }).message().find("item_counter") != std::string::npos);
  claims.tiling = choose_sm90_attention_tiling(256, 4);
  REQUIRE(claims.tiling.ping_pong);
  CHECK(claims.dynamic_items());
  CHECK(expect_error([&] { claims.check(bare, 32); }).message().find("item_counter") != std::string::npos);
  CHECK_NOTHROW(plain.check(bare, 32));

  // The sequence-major walk covers the sequences seq_order[0, ordered_seqs) lists: every one, once.
  // mma.sync takes no order.
  bare.item_counter = fake_pointer<int>(0x400300);
  claims.tiling = choose_sm90_attention_tiling(128, 4);
  set_item_order(bare, std::vector<int>{2, 0, 1});
  CHECK_NOTHROW(claims.check(bare, 32));
  AttentionParams outside = bare;
  outside.seq_order[1] = 3;  // num_seqs 3
  CHECK(expect_error([&] { claims.check(outside, 32); }).message().find("seq_order[1]") != std::string::npos);
  outside = bare;
  outside.seq_order[2] = 2;  // 2, 0, 2: sequence 1 never walked
  CHECK(expect_error([&] { claims.check(outside, 32); }).message().find("seq_order[2]") != std::string::npos);
  outside = bare;
  outside.ordered_seqs = 2;  // fewer than num_seqs
  CHECK(expect_error([&] { claims.check(outside, 32); }).message().find("ordered_seqs") != std::string::npos);
  outside = bare;
  outside.ordered_seqs = kAttentionOrderedSeqs + 1;
  CHECK(expect_error([&] { claims.check(outside, 32); }).message().find("ordered_seqs") != std::string::npos);
  CHECK(expect_error([&] { plain.check(bare, 32); }).message().find("ordered_seqs") != std::string::npos);
  set_item_order(bare, std::vector<int>{});
  CHECK(bare.ordered_seqs == 0);
  CHECK_NOTHROW(plain.check(bare, 32));
  CHECK(expect_error([&] { set_item_order(bare, std::vector<int>(kAttentionOrderedSeqs + 1, 0)); })
            .message()
            .find("seq_order") != std::string::npos);

  // A split tail: the sm_90a kernel with splits_tail only (at every head dim), 2 to kAttentionMaxSplitParts
  // parts, at most the launch's items and kMaxTailSplitUnits parts, with its partials and counters.
  set_item_order(bare, std::vector<int>{});
  AttentionParams split = bare;
  split.split_items = 8;
  split.split_parts = 4;
  split.split_partials = fake_pointer<float>(0x500000);
  split.split_counters = fake_pointer<int>(0x400304);
  CHECK(expect_error([&] { claims.check(split, 32); }).message().find("splits_tail") != std::string::npos);
  CHECK(expect_error([&] { plain.check(split, 32); }).message().find("split_items") != std::string::npos);
  claims.splits_tail = true;
  CHECK_NOTHROW(claims.check(split, 32));
  AttentionParams broken = split;
  broken.split_parts = 1;
  CHECK(expect_error([&] { claims.check(broken, 32); }).message().find("split_parts") != std::string::npos);
  broken.split_parts = kAttentionMaxSplitParts + 1;
  CHECK(expect_error([&] { claims.check(broken, 32); }).message().find("split_parts") != std::string::npos);
  broken = split;
  broken.split_items = kMaxTailSplitUnits;  // 500 tokens x 3 sequences: 16 x 3 x 8 = 384 items
  CHECK(expect_error([&] { claims.check(broken, 32); }).message().find("split_items") != std::string::npos);
  broken.split_items = 385;
  CHECK(expect_error([&] { claims.check(broken, 32); }).message().find("work items") != std::string::npos);
  broken = split;
  broken.split_items = -1;
  CHECK(expect_error([&] { claims.check(broken, 32); }).message().find("split_items") != std::string::npos);
  broken = split;
  broken.split_partials = nullptr;
  CHECK(expect_error([&] { claims.check(broken, 32); }).message().find("split_partials") !=
        std::string::npos);
  AttentionSpec wide_claims = claims;
  wide_claims.head_dim = wide_claims.value_head_dim = 256;
  wide_claims.tiling = choose_sm90_attention_tiling(256, 4);
  AttentionParams wide_split = split;
  wide_split.query_row_stride = (32 + 2 * 8) * 256;
  wide_split.output_row_stride = 32 * 256;
  wide_split.split_items = 0;
  CHECK_NOTHROW(wide_claims.check(wide_split, 32));
  wide_split.split_items = 8;
  CHECK_NOTHROW(wide_claims.check(wide_split, 32));  // D 256 splits (since session 53)
  wide_claims.splits_tail = false;
  CHECK(expect_error([&] { wide_claims.check(wide_split, 32); }).message().find("split_items") !=
        std::string::npos);

  // whole_chunk_spans: 0 or 1, and 1 only for the sm_90a kernel with spans.
  AttentionParams whole = split;
  whole.split_items = 0;
  whole.whole_chunk_spans = 1;
  CHECK(expect_error([&] { claims.check(whole, 32); }).message().find("whole_chunk_spans") !=
        std::string::npos);
  AttentionSpec claims_spans = claims;
  claims_spans.has_spans = true;
  whole.span_offsets = fake_pointer<int>(0x700000);
  CHECK_NOTHROW(claims_spans.check(whole, 32));
  whole.whole_chunk_spans = 2;
  CHECK(expect_error([&] { claims_spans.check(whole, 32); }).message().find("whole_chunk_spans") !=
        std::string::npos);

  // A traced kernel needs its trace buffer; the others ignore the pointer.
  AttentionSpec traced = claims;
  traced.traces = true;
  CHECK(expect_error([&] { traced.check(split, 32); }).message().find("trace") != std::string::npos);
  AttentionParams with_trace = split;
  with_trace.trace = fake_pointer<unsigned long long>(0x600000);
  CHECK_NOTHROW(traced.check(with_trace, 32));
  CHECK_NOTHROW(claims.check(with_trace, 32));

  // An fp8 cache needs finite positive scales.
  spec.kv_fp8 = true;
  good.k_scale = 0.05f;
  good.v_scale = 2.0f;
  CHECK_NOTHROW(spec.check(good, 32));
  rejected([](AttentionParams& p) { p.k_scale = 0.0f; }, "k_scale");
  rejected([](AttentionParams& p) { p.k_scale = std::numeric_limits<float>::infinity(); }, "k_scale");
  rejected([](AttentionParams& p) { p.v_scale = -1.0f; }, "v_scale");
  rejected([](AttentionParams& p) { p.v_scale = std::numeric_limits<float>::quiet_NaN(); }, "v_scale");
}

TEST_CASE("attention compiles for sm_80 and sm_90a without spills", "[plan][attention][nvrtc]") {
  struct Case {
    int head_dim, value_head_dim, group_size, block_size;
    bool all_features;
  };
  const std::vector<Case> cases = {
      {64, 64, 8, 16, false},   {64, 64, 8, 32, true},    {128, 128, 4, 16, false}, {128, 128, 1, 1, true},
      {256, 256, 2, 64, false}, {256, 256, 2, 16, true},  {80, 80, 1, 16, true},    {96, 96, 3, 32, false},
      {128, 64, 4, 16, true},   {192, 128, 8, 16, false}, {40, 40, 1, 16, true},    {16, 16, 1, 8, false},
      {256, 128, 1, 16, true},  {72, 200, 2, 16, false},
  };
  // fp8 KV cache specializations ([fp8kv]): both warp counts, odd multiples of 8, every feature.
  const std::vector<Case> fp8_cases = {
      {128, 128, 4, 16, false}, {128, 128, 1, 1, true}, {256, 256, 2, 64, true},
      {72, 40, 2, 16, true},    {64, 64, 8, 32, true},  {256, 128, 1, 16, false},
  };
  std::vector<std::pair<AttentionSpec, config::Arch>> jobs;
  for (const config::Arch arch : {kSm80, kSm90a}) {
    for (const Case& c : cases)
      jobs.push_back(
          {make_spec(c.head_dim, c.value_head_dim, c.group_size, c.block_size, arch, c.all_features), arch});
    for (const Case& c : fp8_cases)
      jobs.push_back(
          {make_spec(c.head_dim, c.value_head_dim, c.group_size, c.block_size, arch, c.all_features, true),
           arch});
  }
  std::vector<compiler::CompiledKernel> kernels(jobs.size());
  try {
    compiler::for_each_parallel(jobs.size(), 0, [&](std::size_t i) {
      kernels[i] = plan_testing::source_tree_compiler().compile(jobs[i].first.source(),
                                                                compiler::CompileOptions{jobs[i].second});
    });
  } catch (const Error& error) {
    FAIL(error.what() << "\n" << error.payload());
  }
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const AttentionSpec& spec = jobs[i].first;
    const compiler::ResourceUsage& r = kernels[i].resources;
    INFO(jobs[i].second.name() << " " << spec.source().spec.dump());
    INFO(kernels[i].log);
    std::printf(
        "attention %-6s D %3d Dv %3d group %d block %2d bm %3d bn %2d features %d fp8 %d: %3d registers, "
        "%d spill bytes, %d stack bytes, %6d dynamic smem\n",
        jobs[i].second.name().c_str(), spec.head_dim, spec.value_head_dim, spec.group_size, spec.block_size,
        spec.tiling.block_m, spec.tiling.block_n, int(spec.has_softcap), int(spec.kv_fp8), r.registers,
        r.spill_bytes(), r.stack_bytes, spec.dynamic_shared_bytes());
    CHECK(kernels[i].lowered_name.find("attention_kernel") != std::string::npos);
    CHECK(r.registers > 0);
    CHECK(r.registers <= 255);
    CHECK(r.spill_bytes() == 0);
    CHECK(r.stack_bytes == 0);
    // ptxas serializes the wgmma pipeline (and says so) when it sees in-flight accumulators or A
    // fragments touched before the wait: the overlapped schedule would silently lose its point.
    CHECK(kernels[i].log.find("serialized") == std::string::npos);
  }
}

TEST_CASE("attention kernel choice: wgmma on sm_90a for the features it covers, mma.sync otherwise",
          "[plan][attention]") {
  constexpr config::Arch kSm90{9, 0, false};
  const auto choose = [](int d, int dv, config::Arch arch, bool bf16_cache = true) {
    return choose_attention_kernel(d, dv, bf16_cache, arch);
  };
  for (const int d : {64, 128, 256}) {
    CHECK(choose(d, d, kSm90a) == AttentionKernel::wgmma_sm90);
    CHECK(choose(d, d, kSm90) == AttentionKernel::mma_sync);  // no arch-specific features: no wgmma
    CHECK(choose(d, d, kSm80) == AttentionKernel::mma_sync);
    CHECK(choose(d, d, kSm89) == AttentionKernel::mma_sync);
    CHECK(choose(d, d, config::Arch{10, 0, true}) == AttentionKernel::mma_sync);
    // An fp8 cache up to D 128: at D 256 its staging buffers do not fit beside two bf16 stages.
    CHECK(choose(d, d, kSm90a, /*bf16_cache=*/false) ==
          (d <= 128 ? AttentionKernel::wgmma_sm90 : AttentionKernel::mma_sync));
    CHECK(choose(d, d, kSm80, /*bf16_cache=*/false) == AttentionKernel::mma_sync);
  }
  for (const int d : {16, 40, 80, 96, 192}) CHECK(choose(d, d, kSm90a) == AttentionKernel::mma_sync);
  CHECK(choose(128, 64, kSm90a) == AttentionKernel::mma_sync);  // value_head_dim != head_dim
  CHECK(choose(64, 256, kSm90a) == AttentionKernel::mma_sync);
}

TEST_CASE("sm_90a attention tiling: 128 query rows (192 at D 64), 128-key tiles up to D 128, 64 at D 256",
          "[plan][attention]") {
  for (const int d : {64, 128, 256}) {
    const AttentionTiling tiling = choose_sm90_attention_tiling(d, 4);
    INFO("head_dim " << d);
    // Three consumer warpgroups at D 64 (512 threads), two elsewhere (384).
    CHECK(tiling.block_m == (d == 64 ? 192 : 128));
    CHECK(attention_sm90_threads(tiling.block_m) == (d == 64 ? 512 : 384));
    CHECK(tiling.block_n == (d <= 128 ? 128 : 64));
    // Three stages where they fit (D 64, 128), two at D 256; the overlapped schedule with three stages and
    // two consumer warpgroups only (D 128).
    CHECK(tiling.stages == (d <= 128 ? 3 : 2));
    CHECK(tiling.overlap_softmax == (d == 128));
    CHECK(tiling.ping_pong == (d == 256));  // turns only between two consumer warpgroups in series
    CHECK(tiling.heads_per_cta == 4);
    CHECK(tiling.shared_bytes ==
          sm90_attention_shared_bytes(d, tiling.block_n, tiling.stages, false, false, tiling.block_m));
    CHECK(tiling.shared_bytes <= max_shared_bytes_per_block(kSm90a));
  }
  // D 64 with 192 rows: Q [192, 64] + 3 x (K + V) [128, 64] bf16 = 120 KiB, plus slack, six stage
  // mbarriers, Q's one band's empty mbarrier (its copies ride the first tile's full one) and the item
  // schedule's: an mbarrier, a slot and the producers' two slots (16 + 8 bytes).
  CHECK(sm90_attention_shared_bytes(64, 128, 3, false, false, 192) == 1024 + 120 * 1024 + 48 + 8 + 24);
  // Q [128, 128] + 2 x (K + V) [128, 128] bf16 = 160 KiB, plus alignment slack, four stage mbarriers, Q's
  // four (an empty and a full one for each warpgroup's band) and the item schedule's 40 bytes (an
  // mbarrier and a slot per band, the producers' two slots).
  CHECK(sm90_attention_shared_bytes(128, 128, 2) == 1024 + 160 * 1024 + 32 + 32 + 40);
  // Three stages: 224 KiB + slack + ten mbarriers + the item schedule's, just under the 227 KiB opt-in
  // limit; D 256 would not fit.
  CHECK(sm90_attention_shared_bytes(128, 128, 3) == 1024 + 224 * 1024 + 48 + 32 + 40);
  CHECK(sm90_attention_shared_bytes(256, 64, 3) > max_shared_bytes_per_block(kSm90a));
  // An fp8 cache adds two staging buffers of K and V codes: D 128 keeps two stages (224 KiB + slack), in
  // series; D 64 keeps three and the overlapped schedule.
  CHECK(sm90_attention_shared_bytes(128, 128, 2, true) == 1024 + 224 * 1024 + 32 + 32 + 40);
  const AttentionTiling fp8_128 = choose_sm90_attention_tiling(128, 4, /*kv_fp8=*/true);
  CHECK(fp8_128.stages == 2);
  CHECK_FALSE(fp8_128.overlap_softmax);
  CHECK(fp8_128.shared_bytes == sm90_attention_shared_bytes(128, 128, 2, true));
  const AttentionTiling fp8_64 = choose_sm90_attention_tiling(64, 4, /*kv_fp8=*/true);
  CHECK(fp8_64.stages == 3);
  CHECK(fp8_64.block_m == 192);
  CHECK_FALSE(fp8_64.overlap_softmax);
  CHECK_THROWS_AS(choose_sm90_attention_tiling(96, 4), Error);
  CHECK_THROWS_AS(choose_sm90_attention_tiling(192, 4), Error);
  CHECK_THROWS_AS(choose_sm90_attention_tiling(128, 0), Error);
  // GQA packing: the largest divisor of the group up to 16 heads (at least 8 tokens per 128-row CTA).
  const std::vector<std::pair<int, int>> packing = {{1, 1},   {2, 2},   {3, 3},   {4, 4},   {6, 6},
                                                    {7, 7},   {8, 8},   {16, 16}, {20, 10}, {24, 12},
                                                    {32, 16}, {48, 16}, {64, 16}, {17, 1}};
  for (const auto& [group, heads] : packing) {
    INFO("group_size " << group);
    CHECK(choose_sm90_attention_tiling(128, group).heads_per_cta == heads);
  }
}

TEST_CASE("attention spec on sm_90a: the wgmma kernel's stub, launch shape and checks", "[plan][attention]") {
  const config::AttentionConfig llama = config::parse(nlohmann::json{{"schema", "attnplan/v1"},
                                                                     {"hidden_size", 4096},
                                                                     {"query_heads", 32},
                                                                     {"kv_heads", 8},
                                                                     {"sliding_window", 4096},
                                                                     {"kv_cache", {{"block_size", 16}}}});
  const AttentionSpec spec = AttentionSpec::from_config(llama, kSm90a);
  CHECK(spec.kernel == AttentionKernel::wgmma_sm90);
  AttentionTiling expected = choose_sm90_attention_tiling(128, 4);
  expected.kv_tma = true;  // pages of 16 at D 128: sm90_kv_tma_supported
  CHECK(spec.tiling == expected);
  CHECK(spec.tiling.heads_per_cta == 4);
  CHECK(spec.threads() == 384);
  const compiler::KernelSource source = spec.source();
  const std::string stub = source.render_stub();
  CHECK(stub.find("#include \"attnplan/attention_sm90.cuh\"") != std::string::npos);
  CHECK(stub.find("attention_sm90_kernel") != std::string::npos);
  CHECK(stub.find("/*head_dim=*/128, /*group_size=*/4, /*heads_per_cta=*/4, /*block_size=*/16, "
                  "/*block_n=*/128, /*has_window=*/true, /*has_spans=*/false, /*has_sinks=*/false, "
                  "/*has_softcap=*/false, /*stages=*/3, /*overlap_softmax=*/true, /*ping_pong=*/false") !=
        std::string::npos);
  CHECK(source.spec.at("kernel") == "wgmma_sm90");
  CHECK(source.spec.at("dynamic_shared_bytes") == spec.dynamic_shared_bytes());
  CHECK(spec.dynamic_shared_bytes() == sm90_attention_shared_bytes(128, 128, 3));

  // Work items: ceil(300 / 32) query tiles (4 heads x 32 tokens per CTA) x 3 sequences x 8 head groups (one
  // per kv head) = 240, one CTA each without the SM count, at most one per SM with it.
  CHECK(spec.tiling.persistent);
  const driver::LaunchShape shape = spec.launch_shape(3, 300, 32);
  CHECK(shape.grid.x == 240);
  CHECK(shape.grid.y == 1);
  CHECK(shape.grid.z == 1);
  CHECK(shape.block.x == 384);
  CHECK(spec.launch_shape(3, 300, 32, 132).grid.x == 132);
  CHECK(spec.launch_shape(3, 300, 32, 1000).grid.x == 240);
  AttentionSpec per_item = spec;
  per_item.tiling.persistent = false;
  CHECK(per_item.launch_shape(3, 300, 32, 132).grid.x == 240);
  CHECK_THROWS_AS(spec.launch_shape(3, 300, 30), Error);  // not a multiple of heads_per_cta
  // Items numbered in an int (at most 2^30): 2^25 query tiles x 64 sequences x 8 head groups do not fit.
  CHECK_THROWS_AS(spec.launch_shape(64, 1 << 30, 32, 132), Error);
  CHECK(shape.dynamic_shared_bytes == unsigned(spec.dynamic_shared_bytes()));

  AttentionParams params = llama_params();
  params.window = 4096;
  CHECK_NOTHROW(spec.check(params, 32));
  params.window = 0;
  CHECK_THROWS_AS(spec.check(params, 32), Error);

  // The same config elsewhere keeps the mma.sync kernel; a softcap, sinks or spans keep the wgmma kernel,
  // rendered as their traits.
  CHECK(AttentionSpec::from_config(llama, kSm80).kernel == AttentionKernel::mma_sync);
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"softcap", 50.0}, {"sinks", true}, {"bidirectional_spans", true}}) {
    nlohmann::json with = config::to_json(llama);
    with[field] = value;
    INFO(field);
    const AttentionSpec featured = AttentionSpec::from_config(config::parse(with), kSm90a);
    CHECK(featured.kernel == AttentionKernel::wgmma_sm90);
    CHECK(featured.source().render_stub() != spec.source().render_stub());
  }
  // A spec forced onto the wgmma kernel with a shape it lacks is refused when rendered.
  AttentionSpec forced = spec;
  forced.value_head_dim = 64;
  CHECK_THROWS_AS(forced.source(), Error);
  forced = spec;
  forced.kv_fp8 = true;
  forced.head_dim = forced.value_head_dim = 256;
  CHECK_THROWS_AS(forced.source(), Error);
  // Three consumer warpgroups (block_m 192) only at D 64 in series.
  forced = spec;
  forced.tiling.block_m = 192;
  forced.tiling.overlap_softmax = false;
  CHECK_THROWS_AS(forced.source(), Error);  // D 128
  forced.head_dim = forced.value_head_dim = 64;
  CHECK_NOTHROW(forced.source());
  CHECK(forced.threads() == 512);
  CHECK(forced.source().render_stub().find("/*consumers=*/3") != std::string::npos);
  forced.tiling.overlap_softmax = true;
  CHECK_THROWS_AS(forced.source(), Error);
  forced.tiling.block_m = 256;
  forced.tiling.overlap_softmax = false;
  CHECK_THROWS_AS(forced.source(), Error);

  // TMA K/V loads where sm90_kv_tma_supported, rendered as the last trait and in the spec (so the cache
  // keeps both variants apart).
  CHECK(spec.tiling.kv_tma);                   // block 16, D 128: supported
  CHECK(sm90_kv_tma_supported(128, 16, 128));  // 2 x 8 pages x 2 column blocks
  CHECK(sm90_kv_tma_supported(128, 1024, 128));
  CHECK(sm90_kv_tma_supported(64, 8, 128));
  CHECK_FALSE(sm90_kv_tma_supported(128, 8, 128));  // 64 boxes
  CHECK_FALSE(sm90_kv_tma_supported(128, 4, 128));
  CHECK(sm90_kv_tma_supported(256, 64, 64));       // the TMA-only producer: 2 x 1 page x 4 blocks
  CHECK(sm90_kv_tma_supported(256, 16, 64));       // 2 x 4 pages x 4 column blocks
  CHECK_FALSE(sm90_kv_tma_supported(256, 8, 64));  // 64 boxes
  config::AttentionConfig wide = llama;
  wide.head_dim = wide.value_head_dim = 256;
  const AttentionSpec wide_spec = AttentionSpec::from_config(wide, kSm90a);
  CHECK(wide_spec.tiling.kv_tma);
  // D 256 by TMA: 128-key tiles, one stage, K and V on their own barriers (choose_sm90_kv_split), in the
  // shared memory of two 64-key stages (their two barriers per stage are the split's four).
  CHECK(wide_spec.tiling.block_n == 128);
  CHECK(wide_spec.tiling.stages == 1);
  CHECK(wide_spec.tiling.shared_bytes == sm90_attention_shared_bytes(256, 128, 1, false, true));
  CHECK(sm90_attention_shared_bytes(256, 128, 1, false, true) ==
        sm90_attention_shared_bytes(256, 64, 2, false, true));
  CHECK(sm90_kv_tma_supported(256, 16, 128));       // 32 K boxes and 32 V boxes, a lane for each pair
  CHECK_FALSE(sm90_kv_tma_supported(256, 8, 128));  // 64 of each
  CHECK(choose_sm90_kv_split(256, 16, false));
  CHECK_FALSE(choose_sm90_kv_split(256, 16, true));  // a softcap: the consumers spill
  CHECK_FALSE(choose_sm90_kv_split(256, 8, false));  // the gather: 64-key tiles, two stages
  CHECK_FALSE(choose_sm90_kv_split(128, 16, false));
  config::AttentionConfig bidirectional = wide;
  bidirectional.bidirectional_spans = true;
  CHECK(AttentionSpec::from_config(bidirectional, kSm90a).tiling == wide_spec.tiling);  // spans too
  bidirectional.softcap = 30.0;
  const AttentionSpec softcap_spec = AttentionSpec::from_config(bidirectional, kSm90a);
  CHECK(softcap_spec.tiling.kv_tma);
  CHECK(softcap_spec.tiling.block_n == 64);
  CHECK(softcap_spec.tiling.stages == 2);
  CHECK(softcap_spec.tiling.shared_bytes == sm90_attention_shared_bytes(256, 64, 2, false, true));
  // One stage only with the split.
  AttentionSpec one_stage = spec;
  one_stage.tiling.stages = 1;
  CHECK_THROWS_AS(one_stage.source(), Error);
  AttentionSpec wide_gather = wide_spec;
  wide_gather.tiling.kv_tma = false;
  CHECK_THROWS_AS(wide_gather.source(), Error);
  // Its landing barrier is 8 bytes of shared memory on top of the gather's layout.
  CHECK(sm90_attention_shared_bytes(256, 64, 2, false, true) == sm90_attention_shared_bytes(256, 64, 2) + 8);
  CHECK(sm90_attention_shared_bytes(128, 128, 3, false, true) == sm90_attention_shared_bytes(128, 128, 3));
  CHECK(stub.find("/*ping_pong=*/false, /*kv_tma=*/true") != std::string::npos);
  CHECK(source.grid_constant);
  CHECK(source.spec.at("kv_tma") == true);
  AttentionSpec gather = spec;
  gather.tiling.kv_tma = false;
  CHECK(gather.source().render_stub().find("/*kv_tma=*/false") != std::string::npos);
  CHECK(gather.source().spec != source.spec);
  AttentionSpec tma = spec;
  tma.block_size = 4;
  CHECK_THROWS_AS(tma.source(), Error);

  // The split tail: a specialization of its own (the last trait, and in the spec, so the cache keeps both),
  // planned beside a kernel with spans at D <= 128 only; refused where the kernel cannot split.
  CHECK(stub.find("/*consumers=*/2, /*splits_tail=*/false") != std::string::npos);
  CHECK(source.spec.at("splits_tail") == false);
  CHECK_FALSE(split_tail_specialization(spec).has_value());  // causal: no spans
  config::AttentionConfig with_spans = llama;
  with_spans.bidirectional_spans = true;
  const AttentionSpec spans = AttentionSpec::from_config(with_spans, kSm90a);
  CHECK_FALSE(spans.splits_tail);
  const std::optional<AttentionSpec> split = split_tail_specialization(spans);
  REQUIRE(split.has_value());
  CHECK(split->splits_tail);
  AttentionSpec unsplit = *split;
  unsplit.splits_tail = false;
  CHECK(unsplit == spans);  // nothing else differs
  CHECK(split->source().render_stub().find("/*splits_tail=*/true") != std::string::npos);
  CHECK(split->source().spec.at("splits_tail") == true);
  CHECK(split->source().spec != spans.source().spec);
  CHECK_FALSE(split_tail_specialization(AttentionSpec::from_config(with_spans, kSm80)));  // mma.sync
  AttentionSpec sm80_split = AttentionSpec::from_config(with_spans, kSm80);
  sm80_split.splits_tail = true;
  CHECK(expect_error([&] { (void)sm80_split.source(); }).message().find("splits_tail") != std::string::npos);
  // D 256 splits too (since session 53), on the split's 128-key tiles where the plan takes them.
  with_spans.head_dim = with_spans.value_head_dim = 256;
  const std::optional<AttentionSpec> wide_split =
      split_tail_specialization(AttentionSpec::from_config(with_spans, kSm90a));
  REQUIRE(wide_split.has_value());
  CHECK(wide_split->source().render_stub().find("/*splits_tail=*/true") != std::string::npos);

  // The trace: the last trait, in the spec (its own cache entry), on the persistent sm_90a kernel only.
  CHECK(stub.find("/*splits_tail=*/false, /*traces=*/false") != std::string::npos);
  CHECK(source.spec.at("traces") == false);
  AttentionSpec traced = spec;
  traced.traces = true;
  CHECK(traced.source().render_stub().find("/*traces=*/true") != std::string::npos);
  CHECK(traced.source().spec.at("traces") == true);
  CHECK(traced.source().spec != source.spec);
  traced.tiling.persistent = false;
  CHECK(expect_error([&] { (void)traced.source(); }).message().find("persistent") != std::string::npos);
  AttentionSpec traced_sm80 = AttentionSpec::from_config(llama, kSm80);
  traced_sm80.traces = true;
  CHECK(expect_error([&] { (void)traced_sm80.source(); }).message().find("traces") != std::string::npos);
}

TEST_CASE("sm_90a attention's traced specialization compiles without spills", "[plan][attention][nvrtc]") {
  // The three schedules (D 64's three consumer warpgroups, D 128's overlapped softmax, D 256's ping-pong),
  // D 128 with its split tail and an fp8 cache (whose producer records its first tile elsewhere), and D 64's
  // short-launch specialization (two warpgroups, overlapped; a traced plan traces it too): the trace's
  // clocks and stores must not push a warpgroup into spills, or it would time another kernel.
  struct Case {
    int head_dim;
    bool spans;
    bool kv_fp8;
    bool split;
  };
  const Case cases[] = {{64, true, false, false},
                        {128, false, false, false},
                        {128, true, false, true},
                        {128, false, true, false},
                        {256, true, false, false}};
  std::vector<AttentionSpec> specs;
  for (const Case& c : cases) {
    AttentionSpec spec;
    spec.kernel = AttentionKernel::wgmma_sm90;
    spec.head_dim = spec.value_head_dim = c.head_dim;
    spec.group_size = 4;
    spec.block_size = 64;
    spec.has_spans = c.spans;
    spec.kv_fp8 = c.kv_fp8;
    spec.splits_tail = c.split;
    spec.traces = true;
    spec.tiling = choose_sm90_attention_tiling(c.head_dim, 4, c.kv_fp8);
    spec.tiling.kv_tma = !c.kv_fp8;
    specs.push_back(spec);
    if (const std::optional<AttentionSpec> short_launch = short_launch_specialization(spec)) {
      REQUIRE(short_launch->traces);
      specs.push_back(*short_launch);
    }
  }
  REQUIRE(specs.size() == std::size(cases) + 1);  // D 64's short launch beside its planned kernel
  std::vector<compiler::CompiledKernel> kernels(specs.size());
  try {
    compiler::for_each_parallel(specs.size(), 0, [&](std::size_t i) {
      kernels[i] = plan_testing::source_tree_compiler().compile(
          specs[i].source(), compiler::CompileOptions{.arch = kSm90a, .keep_ptx = true});
    });
  } catch (const Error& error) {
    FAIL(error.what() << "\n" << error.payload());
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const compiler::ResourceUsage& r = kernels[i].resources;
    INFO(specs[i].source().spec.dump());
    INFO(kernels[i].log);
    std::printf(
        "traced attention sm_90a D %3d bm %3d spans %d fp8 %d split %d: %3d registers, %d spill bytes\n",
        specs[i].head_dim, specs[i].tiling.block_m, int(specs[i].has_spans), int(specs[i].kv_fp8),
        int(specs[i].splits_tail), r.registers, r.spill_bytes());
    // Each warpgroup's start and end read the global timer; the events read the SM clock.
    CHECK(kernels[i].ptx.find("%globaltimer") != std::string::npos);
    CHECK(kernels[i].ptx.find("%clock64") != std::string::npos);
    CHECK(r.spill_bytes() == 0);
    CHECK(r.stack_bytes == 0);
  }
}

TEST_CASE("sm_90a attention compiles to wgmma without spills", "[plan][attention][nvrtc]") {
  struct Case {
    int head_dim, group_size, block_size;
    bool window;
    bool spans = false;
    bool kv_tma = false;
    bool sinks = false;
    bool kv_fp8 = false;
    bool softcap = false;
  };
  const std::vector<Case> cases = {
      {64, 8, 16, false},
      {64, 4, 64, true},
      {128, 4, 16, false},
      {128, 1, 1, true},
      {128, 8, 64, true},
      {256, 2, 64, false},
      {256, 1, 16, true},
      {128, 6, 32, false},
      {64, 64, 16, true},
      {256, 4, 1, false},
      {64, 2, 2, true},
      {128, 4, 16, false, true},
      {128, 2, 32, true, true},
      {64, 8, 64, false, true},
      {256, 2, 64, true, true},
      // TMA K/V loads: pages smaller than, equal to and larger than a tile, with spans and windows.
      {128, 4, 16, false, false, true},
      {128, 4, 64, true, true, true},
      {128, 4, 64, false, true, true},  // the bidirectional bench row (spans, no window)
      {128, 4, 16, false, true, true},
      {64, 8, 16, false, true, true},
      {256, 2, 16, false, true, true},
      {64, 8, 1024, false, false, true},
      {64, 1, 8, true, false, true},
      {64, 2, 128, true, true, true},
      // D 256: TMA only (the tile past the keys too, its V rows zeroed by the producer).
      {256, 2, 16, false, false, true},
      {256, 4, 64, true, true, true},
      {256, 1, 1024, false, false, true, true},
      {256, 2, 64, true, true, true, false, false, true},
      {256, 4, 16, true, false, true},   // 128-key tiles, K and V apart (choose_sm90_kv_split), a window
      {256, 2, 64, false, false, true},  // the same at pages of 64, causal
      // Sinks (gpt-oss: D 64, group 8, window 128 on alternate layers), also with spans and TMA.
      {64, 8, 16, true, false, false, true},
      {64, 8, 16, false, false, true, true},
      {128, 4, 64, true, true, false, true},
      {256, 2, 16, false, false, false, true},
      // An fp8 cache: codes staged and widened by the producer (D 128: two stages, serial; D 64: three).
      {128, 4, 16, false, false, false, false, true},
      {128, 4, 64, true, true, false, true, true},
      {64, 8, 16, true, false, false, true, true},
      {64, 2, 1, false, true, false, false, true},
      // A softcap (Gemma 2), alone and with everything else.
      {128, 2, 16, true, false, false, false, false, true},
      {256, 2, 64, false, false, false, false, false, true},
      {256, 4, 16, false, true, true, true, false, true},  // by TMA on 128-key tiles, spans, sinks
      {64, 8, 16, true, true, false, true, true, true},
  };
  std::vector<AttentionSpec> specs;
  for (const Case& c : cases) {
    AttentionSpec spec;
    spec.kernel = AttentionKernel::wgmma_sm90;
    spec.head_dim = spec.value_head_dim = c.head_dim;
    spec.group_size = c.group_size;
    spec.block_size = c.block_size;
    spec.has_window = c.window;
    spec.has_spans = c.spans;
    spec.has_sinks = c.sinks;
    spec.kv_fp8 = c.kv_fp8;
    spec.has_softcap = c.softcap;
    spec.tiling = choose_sm90_attention_tiling(c.head_dim, c.group_size, c.kv_fp8);
    spec.tiling.kv_tma = c.kv_tma;
    specs.push_back(spec);
    // The plan's D 256 tiling by TMA (128 keys, one stage, K and V apart), and the same with a softcap,
    // which the GPU test runs though the plan does not take it (choose_sm90_kv_split).
    if (c.kv_tma && choose_sm90_kv_split(c.head_dim, c.block_size, /*has_softcap=*/false)) {
      AttentionSpec split = spec;
      split.tiling = with_sm90_kv_tma(spec.tiling, c.head_dim, c.block_size, /*has_softcap=*/false);
      specs.push_back(split);
    }
    if (spec.tiling.block_m == 192) {  // two consumer warpgroups at D 64: the short-launch specialization
      AttentionSpec two = spec;
      two.tiling.block_m = 128;
      two.tiling.overlap_softmax = two.tiling.stages >= 3;
      two.tiling.shared_bytes = two.dynamic_shared_bytes();
      if (!spec.kv_fp8) CHECK(short_launch_specialization(spec) == two);  // the plan's, with a bf16 cache
      specs.push_back(two);
    }
    if (spec.tiling.overlap_softmax) {  // the serial schedule stays reachable: compile it too
      spec.tiling.overlap_softmax = false;
      spec.tiling.ping_pong = false;
      spec.tiling.stages = 2;
      spec.tiling.shared_bytes = spec.dynamic_shared_bytes();
      specs.push_back(spec);
    }
  }
  // The split tail's specialization of each (the plan's attention_split where there are spans;
  // the GPU test splits every case): the merge beside O in the consumers' registers.
  const std::size_t unsplit = specs.size();
  for (std::size_t i = 0; i < unsplit; ++i) {
    if (!attention_sm90_splits(specs[i].head_dim)) continue;
    AttentionSpec split = specs[i];
    split.splits_tail = true;
    specs.push_back(split);
  }
  std::vector<compiler::CompiledKernel> kernels(specs.size());
  try {
    compiler::for_each_parallel(specs.size(), 0, [&](std::size_t i) {
      compiler::CompileOptions options{kSm90a};
      options.keep_ptx = true;
      kernels[i] = plan_testing::source_tree_compiler().compile(specs[i].source(), options);
    });
  } catch (const Error& error) {
    FAIL(error.what() << "\n" << error.payload());
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const AttentionSpec& spec = specs[i];
    const compiler::ResourceUsage& r = kernels[i].resources;
    INFO(spec.source().spec.dump());
    INFO(kernels[i].log);
    std::printf(
        "attention sm_90a wgmma D %3d group %d block %4d bm %3d bn %3d window %d spans %d sinks %d kv_tma %d "
        "fp8 %d stages %d overlap %d ping-pong %d split %d: %3d registers, %d spill bytes, %d stack bytes, "
        "%6d dynamic smem\n",
        spec.head_dim, spec.group_size, spec.block_size, spec.tiling.block_m, spec.tiling.block_n,
        int(spec.has_window), int(spec.has_spans), int(spec.has_sinks), int(spec.tiling.kv_tma),
        int(spec.kv_fp8), spec.tiling.stages, int(spec.tiling.overlap_softmax), int(spec.tiling.ping_pong),
        int(spec.splits_tail), r.registers, r.spill_bytes(), r.stack_bytes, spec.dynamic_shared_bytes());
    CHECK(kernels[i].lowered_name.find("attention_sm90_kernel") != std::string::npos);
    CHECK(kernels[i].ptx.find("wgmma.mma_async") != std::string::npos);
    CHECK(kernels[i].ptx.find("setmaxnreg") != std::string::npos);
    // The epilogue's output stores: 16 bytes a lane after the quad transpose, head_dim / 32 per accumulator
    // row and two rows a thread; none of 4 bytes (session 42 found NVRTC splitting some uint4 stores, and
    // the 4-byte stores had cost 4-10% of the one-sequence rows: attention-notes.md "Session 43").
    CHECK(count_in(kernels[i].ptx, "st.global.v4.b32", 0, std::string::npos) == 2 * spec.head_dim / 32);
    CHECK(kernels[i].ptx.find("st.global.u32") == std::string::npos);
    CHECK(kernels[i].ptx.find("st.global.b32") == std::string::npos);
    CHECK(kernels[i].ptx.find("%globaltimer") == std::string::npos);  // no trace unless asked
    CHECK(r.registers > 0);
    CHECK(r.spill_bytes() == 0);
    CHECK(r.stack_bytes == 0);
    plan_testing::check_wgmma_asynchronous(kernels[i]);
  }
}
